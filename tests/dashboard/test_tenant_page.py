"""The tenant page: its effective rules with their source, its live buckets, its traffic over
24 h and 30 days, what denied it, the soft quotas it went past, its most throttled users, and a
quick raise of one limit as an expiring override with optimistic locking. The workload goes
through the REST API."""

import datetime as dt
import json
import re

import pytest
from django.contrib.admin.models import LogEntry

from policies.history import replace_rules
from policies.models import Rule, Tenant
from tests.api.test_stats import SOFT
from tests.dashboard.conftest import DASHBOARD, decide, page, text

RAISE = DASHBOARD + "raise-limit/"
PRO_TEAM = "token_bucket(1000, 100/s)"


def tenant_page(console, key):
    return page(console, f"{DASHBOARD}tenants/{key}/")


def chart(html, chart_id):
    match = re.search(rf'<script id="{chart_id}-data" type="application/json">(.*?)</script>', html, re.S)
    assert match, f"no chart data {chart_id}"
    return json.loads(match.group(1))


def rule_row(html, level, rule):
    start = html.index(f'data-level="{level}" data-rule="{rule}"')
    return html[start : html.index("</tr>", start)]


def raise_form(console, key, level, rule, **changes):
    """The quick raise as the page's form would post it, with the version the page shows."""
    html = tenant_page(console, key)
    version = re.search(r'name="version" value="(\d+)"', rule_row(html, level, rule)).group(1)
    return {"key": key, "level": level, "rule": rule, "factor": 2, "hours": 4, "version": version, **changes}


# --- what the page shows ------------------------------------------------------------------


def test_the_effective_rules_name_their_source_tier_override_with_expiry_or_global(api, console):
    html = tenant_page(console, "bigco")
    assert "Overrides apply until 2026-12-31 00:00 UTC" in text(html)
    team = text(rule_row(html, "team", "token_bucket(600, 10/s)"))
    assert "override: bigco, until 2026-12-31 00:00 UTC" in team
    assert "tier: pro" in text(rule_row(html, "user", "token_bucket(50, 10/s)"))
    assert "global" in text(rule_row(html, "global", "token_bucket(100000, 10000/s)"))
    assert 'name="factor"' not in rule_row(html, "global", "token_bucket(100000, 10000/s)")
    # bigco's override lasts longer than any quick raise: at the other levels too, a raise would end it.
    assert "bigco has overrides at team" in text(rule_row(html, "user", "token_bucket(50, 10/s)"))


def test_the_page_shows_the_team_keys_live_buckets_refreshing_themselves(api, decide_client, console):
    decide(decide_client, {"team": "acme"}, cost=400)
    html = tenant_page(console, "acme")
    assert f'hx-get="{DASHBOARD}buckets/?level=team&amp;key=acme&amp;team="' in html
    assert "600 / 1000 tokens left" in text(html)


def test_the_charts_draw_allowed_and_denied_per_minute_over_24_h_and_per_hour_over_30_days(
    api, decide_client, console, clock
):
    for _ in range(3):
        decide(decide_client, {"team": "acme"}, cost=400)  # two allowed, one denied
    clock.advance(2 * 86400)
    decide(decide_client, {"team": "acme"}, cost=1)
    html = tenant_page(console, "acme")
    day, month = chart(html, "usage-24h"), chart(html, "usage-30days")
    assert day["type"] == month["type"] == "line"
    assert len(day["labels"]) == 24 * 60 + 1 and len(month["labels"]) == 30 * 24 + 1
    series = {d["label"]: sum(d["data"]) for d in month["datasets"]}
    assert series == {"allowed": 3, "denied": 1}
    assert {d["label"]: sum(d["data"]) for d in day["datasets"]} == {"allowed": 1, "denied": 0}
    assert "4 decisions: 3 allowed, 1 denied (25 %); cost taken 801" in text(html)
    assert 'id="tenant-over-quota"' not in html  # no soft quota gone over: no line, no list


def test_decisions_past_a_soft_quota_are_drawn_and_listed_by_quota(
    engine, load, policy_doc, decide_client, console, clock
):
    policy_doc["tiers"]["pro"]["team"].append(SOFT)
    load(policy_doc)
    for _ in range(3):
        decide(decide_client, {"team": "acme"}, cost=60)  # the second and third go past 100 a day
    clock.advance(2 * 86400)
    decide(decide_client, {"team": "acme"}, cost=60)  # a new day: 60 fits...
    [quota] = decide(decide_client, {"team": "acme"}, cost=60)["over_quota"]  # ...and 120 does not
    html = tenant_page(console, "acme")
    day, month = chart(html, "usage-24h"), chart(html, "usage-30days")
    assert {d["label"]: sum(d["data"]) for d in month["datasets"]} == {"allowed": 5, "denied": 0, "over quota": 3}
    assert {d["label"]: sum(d["data"]) for d in day["datasets"]} == {"allowed": 2, "denied": 0, "over quota": 1}
    assert "2 decisions: 2 allowed, 0 denied (0 %), 1 let go past a soft quota; cost taken 120" in text(html)
    table = html[html.index('id="tenant-over-quota"') : html.index("</table>", html.index('id="tenant-over-quota"'))]
    assert f"soft quota (level: rule) 24 h 30 days {quota} 1 3" in text(table)


def test_what_denied_it_and_its_most_throttled_users_with_links_to_their_buckets(api, decide_client, console):
    for _ in range(53):
        decide(decide_client, {"user": "alice", "team": "acme"})
    decide(decide_client, {"user": "bob", "team": "acme"})
    decide(decide_client, {"user": "alice", "team": "initech"})
    html = tenant_page(console, "acme")
    blocked = text(html[html.index('id="tenant-blocked-by"') :])
    assert "blocked_by (level: rule) 24 h 30 days user: token_bucket(50, 10/s) 3 3 Shadow rules" in blocked
    users = html[html.index('id="top-users"') :]
    alice = users[users.index('data-user="alice"') : users.index("</tr>", users.index('data-user="alice"'))]
    assert "acme / alice 53 3 5.7 %" in text(alice)
    assert f'href="{DASHBOARD}?level=user&amp;key=alice&amp;team=acme#buckets"' in alice
    assert 'data-user="bob"' in users


def test_a_team_key_with_traffic_but_no_tenant_row_has_a_page_and_an_unknown_one_is_a_404(api, decide_client, console):
    decide(decide_client, {"team": "newco"})
    assert "(no tenant row: the default tier)" in text(tenant_page(console, "newco"))
    assert console.get(f"{DASHBOARD}tenants/never-seen/").status_code == 404


def test_it_links_to_the_tenants_whole_history(api, console):
    acme = Tenant.objects.get(key="acme")
    assert f'href="/admin/policies/tenant/{acme.pk}/history/"' in tenant_page(console, "acme")


def recent_changes(html):
    found = re.search(r'<ul class="recent-changes" id="recent-changes">(.*?)</ul>', html, re.S)
    return [text(item) for item in re.findall(r"<li[^>]*>(.*?)</li>", found.group(1), re.S)] if found else []


def test_its_recent_changes_show_its_own_and_its_overrides_as_diffs(api, console):
    bigco = Tenant.objects.get(key="bigco")
    bigco.tier = bigco.tier.__class__.objects.get(name="free")
    bigco.save()
    replace_rules(bigco, {"team": [{"type": "token_bucket", "capacity": 900, "per_second": 10}]})

    html = tenant_page(console, "bigco")
    assert html.count('id="recent-changes"') == 1
    changes = recent_changes(html)
    assert changes[0].startswith("Changed tenant bigco: tier pro → free; team: token_bucket capacity 600 → 900 ")
    assert changes[-1].startswith("Created tenant bigco: team: added token_bucket(600, 10/s) ")
    latest = bigco.history.order_by("-history_date").first()
    assert f'href="/admin/policies/tenant/{bigco.pk}/history/{latest.history_id}/"' in tenant_page(console, "bigco")


def test_a_quick_raise_shows_among_its_recent_changes_with_its_override(api, console, operator):
    console.post(RAISE, raise_form(console, "acme", "team", PRO_TEAM))
    [raised, created] = recent_changes(tenant_page(console, "acme"))
    assert raised.startswith("Changed tenant acme: overrides until none → ")
    assert "; team: added token_bucket(2000, 200/s) " in raised and raised.endswith(", by operator")
    assert created.startswith("Created tenant acme ")


def test_a_team_key_with_no_tenant_row_has_no_changes_to_show(api, decide_client, console):
    decide(decide_client, {"team": "walk-in"})
    html = tenant_page(console, "walk-in")
    assert recent_changes(html) == [] and "nothing was changed for this team key" in text(html)


# --- the quick raise ----------------------------------------------------------------------


def test_a_quick_raise_writes_an_expiring_override_that_the_next_decision_uses(api, decide_client, console, clock):
    assert not decide(decide_client, {"team": "acme"}, cost=1500)["allowed"]
    response = console.post(RAISE, raise_form(console, "acme", "team", PRO_TEAM))
    assert response.status_code == 302 and response["Location"] == f"{DASHBOARD}tenants/acme/"
    acme = Tenant.objects.get(key="acme")
    assert acme.overrides_until == dt.datetime.fromtimestamp(clock(), dt.UTC) + dt.timedelta(hours=4)
    [rule] = Rule.objects.filter(tenant=acme)
    assert (rule.level.name, rule.type, rule.params) == ("team", "token_bucket", {"capacity": 2000, "per_second": 200})
    assert LogEntry.objects.get().get_change_message() == (
        "raised team: token_bucket(1000, 100/s) x2 for 4 h for acme "
        "(an expiring override, now token_bucket(2000, 200/s))"
    )
    clock.advance(1)  # workers notice a policy change within half a second
    assert decide(decide_client, {"team": "acme"}, cost=1500)["allowed"]
    html = console.get(response["Location"]).content.decode()
    assert "Raised team: token_bucket(1000, 100/s) x2 to token_bucket(2000, 200/s) for acme until" in text(html)
    assert "override: acme" in text(rule_row(html, "team", "token_bucket(2000, 200/s)"))


def test_a_stale_form_is_refused_with_a_clear_message_and_changes_nothing(api, console):
    form = raise_form(console, "acme", "team", PRO_TEAM)
    acme = Tenant.objects.get(key="acme")
    acme.save()  # someone saves the tenant after the page was shown
    response = console.post(RAISE, form, follow=True)
    assert "This tenant or its rules changed since you opened the page" in text(response.content.decode())
    assert not Rule.objects.filter(tenant=acme).exists()
    assert Tenant.objects.get(key="acme").overrides_until is None


def test_a_raise_of_a_rule_that_changed_since_is_refused(api, console):
    form = raise_form(console, "acme", "team", PRO_TEAM)
    Rule.objects.filter(tier__name="pro", level__name="team").update(params={"capacity": 900, "per_second": 90})
    response = console.post(RAISE, form, follow=True)
    assert "changed since you opened the page" in text(response.content.decode())
    assert not Rule.objects.filter(tenant__key="acme").exists()


def test_a_raise_that_would_end_a_longer_override_sooner_is_refused(api, console):
    refusal = "bigco's override at team applies until 2026-12-31 00:00 UTC: a quick raise would end it sooner"
    row = rule_row(tenant_page(console, "bigco"), "team", "token_bucket(600, 10/s)")
    assert refusal in text(row) and 'name="factor"' not in row  # the page says so, and offers no form
    form = {"key": "bigco", "level": "team", "rule": "token_bucket(600, 10/s)", "factor": 2, "hours": 4}
    form["version"] = Tenant.objects.get(key="bigco").version
    response = console.post(RAISE, form, follow=True)
    html = text(response.content.decode())
    assert refusal in html
    assert Rule.objects.get(tenant__key="bigco").params == {"capacity": 600, "per_second": 10}


def test_a_raise_for_a_team_key_without_a_tenant_row_makes_the_tenant(api, decide_client, console):
    decide(decide_client, {"team": "newco"})
    console.post(RAISE, raise_form(console, "newco", "team", "token_bucket(100, 10/s)", factor=1.5, hours=2))
    newco = Tenant.objects.get(key="newco")
    assert newco.tier.name == "free"
    assert Rule.objects.get(tenant=newco).params == {"capacity": 150, "per_second": 15}


@pytest.mark.parametrize("field, value", [("factor", 1), ("factor", 1000), ("hours", 0), ("hours", 10_000)])
def test_a_bad_factor_or_hours_raises_nothing_and_says_why(api, console, field, value):
    form = raise_form(console, "acme", "team", PRO_TEAM, **{field: value})
    response = console.post(RAISE, form, follow=True)
    assert f"Nothing was raised: {field}:" in text(response.content.decode())
    assert not Rule.objects.filter(tenant__key="acme").exists()


def test_a_quick_raise_is_a_post_only(api, console):
    assert console.get(RAISE).status_code == 405


# --- the short windows (issue 25) ------------------------------------------------------------


def recent(html):
    """The short chart's window (its heading) and its data."""
    heading = re.search(r'id="usage-recent">\s*<h3>(.*?)</h3>', html, re.S).group(1)
    return text(heading), chart(html, "usage-recent")


def test_the_page_opens_on_the_shortest_window_with_traffic_a_point_a_minute(api, decide_client, console, clock):
    for _ in range(53):  # pro's user burst holds 50: 3 denied
        decide(decide_client, {"user": "ann", "team": "acme"})
    clock.advance(60)
    heading, data = recent(tenant_page(console, "acme"))
    assert heading == "Last 15 min, one point a minute"
    assert 15 <= len(data["labels"]) <= 17
    lines = {d["label"]: sum(d["data"]) for d in data["datasets"]}
    assert (lines["allowed"], lines["denied"]) == (50, 3)
    clock.advance(2 * 3600)  # two hours later: out of 15 min and 1 h, within 6 h
    heading, data = recent(tenant_page(console, "acme"))
    assert heading == "Last 6 h, one point a minute" and 6 * 60 <= len(data["labels"]) <= 6 * 60 + 2
    assert {d["label"]: sum(d["data"]) for d in data["datasets"]}["denied"] == 3


def test_a_short_window_is_picked_by_its_link(api, decide_client, console):
    decide(decide_client, {"team": "acme"})
    html = page(console, f"{DASHBOARD}tenants/acme/", recent="1h")
    assert recent(html)[0] == "Last 1 h, one point a minute"
    assert '<a href="?recent=1h#usage-recent" class="window current" aria-current="true">1 h</a>' in html
    assert recent(page(console, f"{DASHBOARD}tenants/acme/", recent="2y"))[0] == "Last 15 min, one point a minute"
