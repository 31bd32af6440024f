"""Panel 2: a key's live buckets, every rule with where it comes from, refreshed in place."""

import re

import pytest

from policies.models import Tenant, Tier
from tests.dashboard.conftest import DASHBOARD, decide, page, text


def rule_row(html, rule):
    """The text of the bucket table's row for `rule`."""
    start = html.index(">", html.index(f'<tr class="bucket-rule" data-rule="{rule}"')) + 1
    return text(html[start : html.index("</tr>", start)])


def test_every_rule_of_a_user_key_shows_its_tier_and_live_state(api, decide_client, console):
    decide(decide_client, {"user": "u1", "team": "acme", "global": "*"}, cost=30)
    html = page(console, level="user", key="u1", team="acme")
    acme, pro = Tenant.objects.get(key="acme"), Tier.objects.get(name="pro")
    route = html[html.index('id="bucket-route"') :]
    route = text(route[route.index(">") + 1 : route.index("</p>")])
    assert route == "user: u1 — tier pro, tenant acme refreshed every 3 s"
    assert f'href="/admin/policies/tier/{pro.pk}/change/"' in html
    assert f'href="/admin/policies/tenant/{acme.pk}/change/"' in html
    assert (
        rule_row(html, "token_bucket(50, 10/s)")
        == "token_bucket(50, 10/s) BURST_LIMIT tier: pro 20 / 50 tokens left 3 s"
    )
    assert (
        rule_row(html, "sliding_window(600/60s)")
        == "sliding_window(600/60s) RPM_LIMIT tier: pro 30 / 600 used in the window 1 min"
    )
    # 20 tokens of 50: above the warning bound of 10 (20 % of the room), the optimum at full.
    assert '<meter min="0" max="50.0" value="20.0" low="10.0" high="10.0" optimum="50.0"></meter>' in html


def test_a_bucket_in_debt_shows_its_negative_balance_and_when_it_is_back_above_zero(api, decide_client, console):
    reserved = decide_client.post("/api/v1/reservations", {"keys": {"team": "acme"}, "cost": 10}, format="json")
    commit = f"/api/v1/reservations/{reserved.json()['id']}/commit"
    assert decide_client.post(commit, {"actual_cost": 1300}, format="json").status_code == 200
    html = page(console, level="team", key="acme")
    assert rule_row(html, "token_bucket(1000, 100/s)") == (
        "token_bucket(1000, 100/s) tier: pro -300 / 1000 tokens left in debt: back above zero in 3 s 13 s"
    )


def test_a_tenants_override_is_named_as_the_rules_origin(api, console):
    html = page(console, level="team", key="bigco")
    assert (
        rule_row(html, "token_bucket(600, 10/s)")
        == "token_bucket(600, 10/s) override: bigco 600 / 600 tokens left full now"
    )
    assert "overrides apply until 2026-12-31 00:00 UTC" in text(html)


def test_a_global_key_shows_the_global_rules(api, console):
    html = page(console, level="global", key="*")
    assert rule_row(html, "token_bucket(100000, 10000/s)").startswith("token_bucket(100000, 10000/s) global ")


def test_a_team_with_no_tenant_row_gets_the_default_tier(api, console):
    html = page(console, level="team", key="somebody")
    assert "tier free, no tenant row (default tier)" in text(html)
    assert rule_row(html, "token_bucket(100, 10/s)").startswith("token_bucket(100, 10/s) tier: free 100 / 100")


def test_concurrency_slots_in_flight_are_shown(api, load, policy_doc, decide_client, console):
    policy_doc["tenants"]["streamco"] = {"tier": "pro", "overrides": {"user": [{"type": "concurrency", "limit": 3}]}}
    load(policy_doc)
    api.refresh()
    keys = {"user": "u9", "team": "streamco"}
    for _ in range(2):
        response = decide_client.post("/api/v1/reservations", {"keys": keys, "cost": 1}, format="json")
        assert response.status_code == 201
    html = page(console, level="user", key="u9", team="streamco")
    row = rule_row(html, "concurrency(3, lease 60s) per request")
    assert row.startswith("concurrency(3, lease 60s) per request override: streamco 2 / 3 slots in use")
    assert row.endswith("1 min")  # the slots come back when their lease runs out
    assert 'data-kind="use"' in html and "all slots in use" not in row


def test_a_full_concurrency_rule_is_drawn_as_used_up_in_the_warning_colour(
    api, load, policy_doc, decide_client, console
):
    """Issue 25: "3 / 3 in flight" was drawn like a full bucket, a healthy green bar."""
    policy_doc["tenants"]["streamco"] = {"tier": "pro", "overrides": {"user": [{"type": "concurrency", "limit": 3}]}}
    load(policy_doc)
    api.refresh()
    keys = {"user": "u9", "team": "streamco"}
    for _ in range(3):
        assert decide_client.post("/api/v1/reservations", {"keys": keys, "cost": 1}, format="json").status_code == 201
    html = page(console, level="user", key="u9", team="streamco")
    row = rule_row(html, "concurrency(3, lease 60s) per request")
    assert "3 / 3 slots in use all slots in use" in row
    cell = re.search(r'<td class="state([^"]*)" data-kind="(\w+)">\s*<meter ([^>]*)>', html).groups()
    assert cell[0] == " warning" and cell[1] == "use"
    # The meter's regions put a full rule past `high` with the optimum at 0: the browser's warning.
    assert 'high="2.4' in cell[2] and 'optimum="0"' in cell[2] and 'value="3"' in cell[2]


def test_a_bucket_is_drawn_as_room_full_is_healthy(api, console):
    html = page(console, level="team", key="acme")
    cell = re.search(r'<td class="state([^"]*)" data-kind="(\w+)">\s*<meter ([^>]*)>', html).groups()
    assert cell[0] == "" and cell[1] == "room" and 'optimum="1000' in cell[2]


def test_the_bucket_panel_refreshes_itself_without_reloading_the_page(api, decide_client, console):
    html = page(console, level="team", key="acme")
    assert f'hx-get="{DASHBOARD}buckets/?level=team&amp;key=acme&amp;team="' in html
    assert 'hx-trigger="every 3s" hx-swap="outerHTML"' in html
    decide(decide_client, {"team": "acme"}, cost=250)
    partial = page(console, DASHBOARD + "buckets/", level="team", key="acme", team="")
    assert "<html" not in partial and partial.lstrip().startswith("")
    assert rule_row(partial, "token_bucket(1000, 100/s)").startswith("token_bucket(1000, 100/s) tier: pro 750 / 1000")


def test_a_key_is_exact_not_stripped(api, decide_client, console):
    decide(decide_client, {"team": " acme"}, cost=5)  # a different key, of the default tier
    html = page(console, level="team", key=" acme")
    assert rule_row(html, "token_bucket(100, 10/s)").startswith("token_bucket(100, 10/s) tier: free 95 / 100")


@pytest.mark.parametrize(
    "query, field, message",
    [
        (
            {"level": "planet", "key": "acme"},
            "level",
            "Select a valid choice. planet is not one of the available choices.",
        ),
        ({"level": "team", "key": ""}, "key", "This field is required."),
        ({"level": "team"}, "key", "This field is required."),
        ({"level": "team", "key": "k" * 300}, "key", "Ensure this value has at most 256 characters (it has 300)."),
        ({"level": "user", "key": "u1", "team": "t" * 300}, "team", "at most 256 characters"),
    ],
)
def test_a_bad_query_shows_a_form_error_never_a_500(api, console, query, field, message):
    for path in (DASHBOARD, DASHBOARD + "buckets/"):
        html = page(console, path, **query)
        errors = text(html[html.index('id="bucket-errors"') :])
        assert f"{field} : {message}" in errors or (field in errors and message in errors)
        assert 'id="bucket-rules"' not in html


def test_editing_a_tenants_limits_changes_the_next_decision_and_the_bucket_panel(
    api, load, policy_doc, decide_client, console
):
    for _ in range(5):
        assert decide(decide_client, {"team": "acme"})["allowed"]
    assert "tier: pro 995 / 1000" in text(page(console, level="team", key="acme"))
    policy_doc["tenants"]["acme"]["overrides"] = {"team": [{"type": "token_bucket", "capacity": 5, "per_second": 1}]}
    load(policy_doc)
    api.refresh()  # as every worker does within half a second
    html = page(console, level="team", key="acme")
    assert rule_row(html, "token_bucket(5, 1/s)") == "token_bucket(5, 1/s) override: acme 5 / 5 tokens left full now"
    assert "token_bucket(1000, 100/s)" not in html
    for _ in range(5):
        assert decide(decide_client, {"team": "acme"})["allowed"]
    denial = decide(decide_client, {"team": "acme"})
    assert not denial["allowed"] and denial["blocked_by"] == "team: token_bucket(5, 1/s)"
    html = page(console, level="team", key="acme")
    assert rule_row(html, "token_bucket(5, 1/s)") == "token_bucket(5, 1/s) override: acme 0 / 5 tokens left 5 s"
