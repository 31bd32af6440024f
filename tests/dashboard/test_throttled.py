"""Panel 1: who is throttled right now, and by what. The workload goes through the REST API,
as a gateway's would; the dashboard must show the same numbers the statistics hold."""

import pytest

from policies.models import Tenant
from tests.dashboard.conftest import DASHBOARD, chart_data, decide, page, text

USER_RULE = "user: token_bucket(10, 1/s)"
TEAM_RULE = "team: token_bucket(1000, 100/s)"


@pytest.fixture
def workload(api, decide_client):
    """15 decisions, 5 denied: 3 of user greedy by its free bucket, 2 of team acme by its pro one."""
    for _ in range(13):
        decide(decide_client, {"user": "greedy", "team": "nobody"})
    for _ in range(2):
        decide(decide_client, {"team": "acme"}, cost=1001)


def test_the_totals_count_decisions_and_denials_in_each_window(workload, console):
    html = page(console)
    totals = text(html[html.index('id="denial-totals"') : html.index("</table>", html.index('id="denial-totals"'))])
    assert "5 min 15 5 33.3 %" in totals
    assert "1 h 15 5 33.3 %" in totals
    assert "24 h 15 5 33.3 %" in totals


def test_denials_are_listed_by_blocked_by_in_every_window(workload, console):
    html = page(console)
    table = text(html[html.index('id="blocked-by"') :])
    assert f"{USER_RULE} 3 3 3" in table
    assert f"{TEAM_RULE} 2 2 2" in table
    assert table.index(USER_RULE) < table.index(TEAM_RULE)  # most denied first


def test_the_chart_draws_each_blocked_by_as_a_series_over_time(workload, console, clock, decide_client):
    clock.advance(120)  # two minutes later, the greedy user is refused again
    for _ in range(4):
        decide(decide_client, {"user": "greedy", "team": "nobody"}, cost=5)
    data = chart_data(page(console, window="1h"))
    series = {dataset["label"]: dataset["data"] for dataset in data["datasets"]}
    assert set(series) == {USER_RULE, TEAM_RULE}
    assert sum(series[USER_RULE]) == 5 and sum(series[TEAM_RULE]) == 2
    assert len(data["labels"]) == len(series[USER_RULE]) == 61  # a bar a minute, the current one included
    first, later = [i for i, n in enumerate(series[USER_RULE]) if n]
    assert later - first == 2 and series[USER_RULE][first] == 3 and series[USER_RULE][later] == 2
    assert data["labels"][first] == "00:00" and data["labels"][later] == "00:02"


def test_the_24_hour_chart_has_a_bar_per_quarter_hour(workload, console):
    data = chart_data(page(console, DASHBOARD + "throttled/", window="24h"))
    assert len(data["labels"]) == 97
    assert sum(sum(dataset["data"]) for dataset in data["datasets"]) == 5


def test_old_denials_leave_the_short_window_but_not_the_long_ones(workload, console, clock):
    clock.advance(10 * 60)
    html = page(console)
    totals = text(html[html.index('id="denial-totals"') :])
    assert "5 min 0 0 0 %" in totals and "1 h 15 5 33.3 %" in totals
    table = text(html[html.index('id="blocked-by"') :])
    assert f"{USER_RULE} 0 3 3" in table


def test_the_most_throttled_tenants_and_users_link_to_their_tenant_page_and_buckets(workload, console):
    html = page(console)
    acme = Tenant.objects.get(key="acme")
    top = html[html.index('id="top-keys"') :]
    tenants = top[top.index('data-level="team"') :]
    row = tenants[tenants.index('data-key="acme"') : tenants.index("</tr>", tenants.index('data-key="acme"'))]
    assert '<td class="denied">2</td>' in row
    assert f'href="/admin/policies/tenant/{acme.pk}/change/"' in row
    assert f'href="{DASHBOARD}?level=team&amp;key=acme#buckets"' in row
    users = top[top.index('data-level="user"') :]
    row = users[users.index('data-key="greedy"') : users.index("</tr>", users.index('data-key="greedy"'))]
    assert '<td class="denied">3</td>' in row
    assert f'href="{DASHBOARD}?level=user&amp;key=greedy#buckets"' in row
    assert "tenant page" not in row


def test_a_throttled_team_with_no_tenant_row_has_no_tenant_link(api, decide_client, console):
    decide(decide_client, {"team": "nobody"}, cost=101)  # the free team bucket holds 100
    html = page(console)
    row = html[html.index('data-key="nobody"') :]
    row = row[: row.index("</tr>")]
    assert "live buckets" in row and "tenant page" not in row


def test_the_windows_switch_in_place_and_the_panel_refreshes_itself(workload, console):
    html = page(console, DASHBOARD + "throttled/", window="5m")
    assert f'hx-get="{DASHBOARD}throttled/?window=5m"' in html and 'hx-trigger="every 10s"' in html
    assert 'class="window current"' in html and "Most throttled: Users, last 5 min" in html
    for window in ("5m", "1h", "24h"):
        assert f'hx-get="{DASHBOARD}throttled/?window={window}" hx-target="#throttled"' in html


def test_an_unknown_window_falls_back_to_the_hour(workload, console):
    html = page(console, window="1y")
    assert "Denials by blocked_by, last 1 h" in html


def test_nothing_throttled_says_so(api, console):
    html = page(console)
    assert "No denials in the last 24 h." in html and "Nobody was throttled in the last 1 h." in html
    assert chart_data(html)["datasets"] == []
