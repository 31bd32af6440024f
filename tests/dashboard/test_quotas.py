"""The tenant page's quotas: used against the limit (the warning colour from 80 %, the error
colour when spent), when the period resets in the quota's own time zone, when it runs out, a
burn-down of the period, and a top-up of credits logged under the operator's name."""

import re

import pytest
from django.contrib.admin.models import LogEntry

from policies.models import CreditTopUp
from tests.dashboard.conftest import DASHBOARD, decide, page, text

TEAM = {"team": "acme", "global": "*"}
DAILY = {"type": "quota", "limit": 1000, "period": "day", "timezone": "Europe/Berlin", "label": "DAILY"}
CREDITS = {"type": "quota", "limit": 5000, "period": "none", "label": "CREDITS"}
CREDITS_URL = DASHBOARD + "credits/"


@pytest.fixture
def quotas(engine, load, policy_doc):
    policy_doc["tiers"]["pro"]["team"] = [*policy_doc["tiers"]["pro"]["team"], DAILY, CREDITS]
    load(policy_doc)
    return engine


def quota_block(html, label):
    """The quotas section's block of the quota labelled `label`."""
    section = html[html.index('id="tenant-quotas"') : html.index('id="buckets"')]
    blocks = section.split('<div class="quota quota-')[1:]
    [block] = [b for b in blocks if f'<span class="label">{label}</span>' in b]
    return "quota-" + block


def test_a_quota_shows_used_against_its_limit_and_when_it_resets_in_its_time_zone(quotas, decide_client, console):
    decide(decide_client, TEAM, 300)
    block = quota_block(page(console, f"{DASHBOARD}tenants/acme/"), "DAILY")
    assert "quota-ok" in block
    assert "300 of 1000 used (30 %), 700 left." in text(block)
    assert re.search(r"Resets \d{4}-\d\d-\d\d 00:00 CES?T", text(block)), text(block)


def test_a_quota_past_80_percent_is_drawn_in_the_warning_colour_and_a_spent_one_as_spent(
    quotas, decide_client, console
):
    decide(decide_client, TEAM, 450)
    decide(decide_client, TEAM, 400)
    assert "quota-warning" in quota_block(page(console, f"{DASHBOARD}tenants/acme/"), "DAILY")
    decide(decide_client, TEAM, 150)  # 1000 of 1000
    assert "quota-spent" in quota_block(page(console, f"{DASHBOARD}tenants/acme/"), "DAILY")


def test_credits_are_topped_up_from_the_page_and_the_top_up_is_logged(quotas, decide_client, console, operator):
    decide(decide_client, TEAM, 400)
    html = page(console, f"{DASHBOARD}tenants/acme/")
    form = quota_block(html, "CREDITS")
    position = re.search(r'name="position" value="(\d+)"', form).group(1)
    answer = console.post(CREDITS_URL, {"key": "acme", "level": "team", "position": position, "add": "250"})
    assert answer.status_code == 302 and answer["Location"].endswith("/tenants/acme/#tenant-quotas")
    after = page(console, f"{DASHBOARD}tenants/acme/")
    assert "balance is 4850" in after
    assert "4850 left" in text(quota_block(after, "CREDITS"))  # 400 spent of 5000, then 250 more
    record = CreditTopUp.objects.get()
    assert (record.amount, record.balance, record.user) == (250, 4850, operator)
    assert LogEntry.objects.filter(change_message__contains="added 250 credits").exists()


@pytest.mark.parametrize("add", ["0", "-5", "lots"])
def test_a_bad_top_up_adds_nothing_and_says_why(quotas, console, add):
    answer = console.post(CREDITS_URL, {"key": "acme", "level": "team", "position": "2", "add": add}, follow=True)
    assert "No credits were added" in answer.content.decode()
    assert not CreditTopUp.objects.exists()


def test_a_tenant_without_quotas_shows_no_quota_section(api, console):
    assert 'id="tenant-quotas"' not in page(console, f"{DASHBOARD}tenants/acme/")


# --- the dashboard: close to their quota ---------------------------------------------------------

FREE_DAY = {"type": "quota", "limit": 50, "period": "day", "label": "FREE_DAY"}


@pytest.fixture
def rounds(clock):
    from core.flusher import Flusher
    from policies.services.alerts import AlertRounds
    from policies.services.jobs import JobPool

    return AlertRounds(None, clock=clock, pool=JobPool("dashboard-quotas", workers=1, waiting=5), flusher=Flusher())


def near_quota_rows(html):
    """The dashboard's "close to their quota" rows: (tenant, state, text), in order."""
    table = html[html.index('id="near-quota"') :]
    table = table[: table.index("</table>")]
    rows = re.findall(r'<tr class="near-quota" data-key="([^"]+)" data-state="([^"]+)">(.*?)</tr>', table, re.S)
    return [(key, state, text(body)) for key, state, body in rows]


def test_the_dashboard_lists_the_tenants_at_80_percent_of_a_quota_fullest_first(
    engine, load, policy_doc, decide_client, console, rounds, clock
):
    policy_doc["tiers"]["pro"]["team"] = [*policy_doc["tiers"]["pro"]["team"], DAILY]
    policy_doc["tiers"]["free"]["team"] = [*policy_doc["tiers"]["free"]["team"], FREE_DAY]
    load(policy_doc)
    assert near_quota_rows(page(console)) == []
    assert "No tenant has used 80 % of a quota this period." in text(page(console))
    decide(decide_client, TEAM, 850)  # acme, pro: 85 % of 1000
    decide(decide_client, {"team": "zeta", "global": "*"}, 50)  # free: all of 50
    decide(decide_client, {"team": "small", "global": "*"}, 10)  # free: 20 %, not listed
    rounds.run(["acme", "zeta", "small"], clock())
    rows = near_quota_rows(page(console))
    assert [(key, state) for key, state, _ in rows] == [("zeta", "spent"), ("acme", "warning")]
    assert "team: quota(50/day) resets in 24 h 100 % 50 / 50" in rows[0][2], rows[0][2]
    assert "team: quota(1000/day Europe/Berlin) resets in 22 h 85 % 850 / 1000" in rows[1][2], rows[1][2]
    assert 'href="/admin/dashboard/tenants/acme/#tenant-quotas"' in page(console)


def test_a_tenant_leaves_the_list_when_its_period_has_passed(
    engine, load, policy_doc, decide_client, console, rounds, clock
):
    policy_doc["tiers"]["free"]["team"] = [*policy_doc["tiers"]["free"]["team"], FREE_DAY]
    load(policy_doc)
    decide(decide_client, {"team": "zeta", "global": "*"}, 45)
    rounds.run(["zeta"], clock())
    assert [key for key, _, _ in near_quota_rows(page(console))] == ["zeta"]
    clock.advance(86400)  # the next day: a new period, nothing used yet
    assert near_quota_rows(page(console)) == []


def test_top_ups_are_listed_in_the_admins_ledger_read_only(quotas, decide_client, console, operator):
    html = page(console, f"{DASHBOARD}tenants/acme/")
    position = re.search(r'name="position" value="(\d+)"', quota_block(html, "CREDITS")).group(1)
    console.post(CREDITS_URL, {"key": "acme", "level": "team", "position": position, "add": "125"})
    ledger = text(page(console, "/admin/policies/credittopup/"))
    assert "acme team quota(5000 credits) 125.0 5125.0 operator" in ledger, ledger
    assert console.get("/admin/policies/credittopup/add/").status_code == 403
    top_up = CreditTopUp.objects.get()
    assert console.post(f"/admin/policies/credittopup/{top_up.pk}/delete/", {"post": "yes"}).status_code == 403
    assert CreditTopUp.objects.filter(pk=top_up.pk).exists()
