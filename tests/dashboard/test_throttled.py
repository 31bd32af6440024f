"""Panel 1: who is throttled right now, and by what. The workload goes through the REST API,
as a gateway's would; the dashboard must show the same numbers the statistics hold."""

import html as html_lib
import re

import pytest

from core.decision import RATE_LIMITED, Decision, allowed
from limiter_admin.console.formatting import rule_colour
from policies.services.recording import record_embedded
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


def test_decisions_made_in_django_apps_get_a_column_once_there_are_any(workload, console):
    html = page(console)
    assert "in Django apps" not in html  # none yet: the table keeps its four columns
    for allowed_ in (True, True, False):
        decision = allowed(1.0) if allowed_ else Decision(False, 1.0, USER_RULE, RATE_LIMITED, 0.0, False)
        record_embedded({"user": "app-user", "team": "acme"}, decision, 1, "decorator", replayable=False)
    html = page(console)
    totals = text(html[html.index('id="denial-totals"') : html.index("</table>", html.index('id="denial-totals"'))])
    assert "in Django apps (denied)" in totals
    assert "5 min 18 6 33.3 % 3 (1)" in totals and "24 h 18 6 33.3 % 3 (1)" in totals


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


def row_of(html, section, key, team=None):
    """The table row of `key` (and `team`) in a top-keys section ("tenants" or a level)."""
    part = html[html.index(f'data-level="{section}"') :]
    marker = f'data-key="{key}"' + (f' data-team="{team}"' if team else "")
    start = part.index(marker)
    return part[start : part.index("</tr>", start)]


def test_the_most_throttled_tenants_and_users_link_to_their_tenant_page_and_buckets(workload, console):
    html = page(console)
    # "nobody" has no tenant row: its user's denials count for it all the same.
    nobody = row_of(html, "tenants", "nobody")
    assert '<td class="denied count">3</td>' in nobody
    assert f'href="{DASHBOARD}tenants/nobody/"' in nobody
    # Its denials were its user's (issue 25: the team's bucket, full, told nothing): that user's buckets.
    assert f'href="{DASHBOARD}?level=user&amp;key=greedy&amp;team=nobody#buckets"' in nobody
    assert "user greedy: live buckets" in text(nobody)
    acme = row_of(html, "tenants", "acme")
    assert '<td class="denied count">2</td>' in acme and f'href="{DASHBOARD}tenants/acme/"' in acme
    assert f'href="{DASHBOARD}?level=team&amp;key=acme#buckets"' in acme  # denied at its own level
    greedy = row_of(html, "user", "greedy", "nobody")
    assert '<td class="denied count">3</td>' in greedy
    assert f'href="{DASHBOARD}?level=user&amp;key=greedy&amp;team=nobody#buckets"' in greedy
    assert f'href="{DASHBOARD}tenants/nobody/"' in greedy
    assert "nobody / greedy" in text(greedy)


def test_acmes_users_denials_make_acme_a_top_tenant(api, decide_client, console):
    for user in ("alice", "bob"):
        for _ in range(53):  # the pro burst holds 50
            decide(decide_client, {"user": user, "team": "acme"})
    html = page(console)
    assert '<td class="denied count">6</td>' in row_of(html, "tenants", "acme")
    top = html[html.index('id="top-keys"') : html.index('id="health-panel"')]
    assert 'data-level="team"' not in top  # nobody was denied at the team level itself


def test_one_user_id_in_two_teams_is_two_rows_each_linking_to_its_own_buckets(api, decide_client, console):
    for team, times in (("acme", 52), ("initech", 11)):
        for _ in range(times):
            decide(decide_client, {"user": "shared", "team": team})
    html = page(console)
    in_acme, in_initech = row_of(html, "user", "shared", "acme"), row_of(html, "user", "shared", "initech")
    assert '<td class="denied count">2</td>' in in_acme and '<td class="denied count">1</td>' in in_initech
    assert "team=acme" in in_acme and "team=initech" in in_initech


def test_a_users_link_opens_the_bucket_that_throttled_it(api, decide_client, console):
    for _ in range(52):
        decide(decide_client, {"user": "alice", "team": "acme"})
    html = page(console)
    link = re.search(r'href="([^"]+)" class="buckets-link"', row_of(html, "user", "alice", "acme")).group(1)
    buckets = text(console.get(html_lib.unescape(link)).content.decode())
    # acme's pro bucket of 50, all taken: not the default tier's full bucket of 10.
    assert "user: alice — tier pro, tenant acme" in buckets
    assert "0 / 50 tokens left" in buckets and "/ 10 tokens left" not in buckets


def test_shadow_rules_would_be_denials_are_shown_per_window(engine, load, policy_doc, decide_client, console, clock):
    policy_doc["tiers"]["free"]["user"].append({"type": "fixed_window", "limit": 2, "window": 60, "shadow": True})
    load(policy_doc)
    for _ in range(4):
        decide(decide_client, {"user": "u1", "team": "nobody"})
    clock.advance(10 * 60)
    for _ in range(3):
        decide(decide_client, {"user": "u1", "team": "nobody"})
    html = page(console)
    table = text(html[html.index('id="shadow-rules"') : html.index("</table>", html.index('id="shadow-rules"'))])
    assert "user: fixed_window(2/60s) 1 3 3" in table


def test_a_rules_colour_is_derived_from_its_name_the_same_in_every_window_and_table(workload, console):
    hour, day = chart_data(page(console, window="1h")), chart_data(page(console, window="24h"))
    colours = {d["label"]: d["colour"] for d in hour["datasets"]}
    assert colours == {d["label"]: d["colour"] for d in day["datasets"]}
    assert colours == {USER_RULE: rule_colour(USER_RULE), TEAM_RULE: rule_colour(TEAM_RULE)}
    assert colours[USER_RULE] != colours[TEAM_RULE]
    assert f'style="background: {rule_colour(USER_RULE)}"' in page(console)


def test_the_windows_switch_in_place_and_the_panel_refreshes_itself(workload, console):
    html = page(console, DASHBOARD + "throttled/", window="5m")
    assert f'hx-get="{DASHBOARD}throttled/?window=5m"' in html and 'hx-trigger="every 10s"' in html
    assert 'class="window current"' in html and "Most throttled: Users (team / user), last 5 min" in html
    for window in ("5m", "1h", "24h"):
        assert f'hx-get="{DASHBOARD}throttled/?window={window}" hx-target="#throttled"' in html


def test_an_unknown_window_falls_back_to_the_hour(workload, console):
    html = page(console, window="1y")
    assert "Denials over the last 1 h, one bar per 1 min" in text(html)
    # The table beside it counts every window: its heading says so (issue 25).
    assert "Denials by blocked_by, in each window" in text(html)


def test_nothing_throttled_says_so(api, console):
    html = page(console)
    assert "No denials in the last 24 h." in html and "Nobody was throttled in the last 1 h." in html
    assert "No shadow rule would have denied anything in the last 24 h." in html
    assert chart_data(html)["datasets"] == []
