"""Quotas in a real browser: the tenant page draws each quota's bar, its reset in the quota's
own time zone and its burn-down chart, and tops up credits; the dashboard lists the tenants
at or above 80 % of a quota next to the most throttled. Screenshots at 1366 and 390 px wide
go to docs/screenshots/ (quotas-tenant-*, quotas-dashboard-*), and nothing is cut off."""

import time

import pytest
from playwright.sync_api import expect

from core.flusher import Flusher
from policies.services.alerts import AlertRounds
from policies.services.jobs import JobPool
from policies.telemetry import denial_stats

from .test_alerts import DOCS_SCREENSHOTS, fits
from .test_console import decide, log_in, operator, token  # noqa: F401  (fixtures)

pytestmark = pytest.mark.browser

DAILY = {"type": "quota", "limit": 1000, "period": "day", "timezone": "America/New_York", "label": "DAILY"}
MONTHLY = {"type": "quota", "limit": 20000, "period": "month", "label": "MONTHLY"}
CREDITS = {"type": "quota", "limit": 5000, "period": "none", "label": "CREDITS"}
FREE_DAY = {"type": "quota", "limit": 50, "period": "day", "label": "FREE_DAY"}
TENANT = "/admin/dashboard/tenants/acme/"


@pytest.fixture
def quotas(memory_engine, load, policy_doc, clock):
    policy_doc["tiers"]["pro"]["team"] = [*policy_doc["tiers"]["pro"]["team"], DAILY, MONTHLY, CREDITS]
    policy_doc["tiers"]["free"]["team"] = [*policy_doc["tiers"]["free"]["team"], FREE_DAY]
    load(policy_doc)
    clock.advance(time.time() - clock())  # the decisions' clock at the wall clock's time, as served
    return memory_engine


def test_the_tenant_page_and_the_dashboard_show_the_quotas(page, live_server, quotas, token, operator, clock):
    for cost in (400, 450):  # acme: 850 of its daily 1000
        assert decide(live_server, token, {"team": "acme", "global": "*"}, cost=cost)["allowed"]
        clock.advance(60)
    assert decide(live_server, token, {"team": "zeta", "global": "*"}, cost=50)["allowed"]  # all of free's 50
    assert not decide(live_server, token, {"team": "zeta", "global": "*"}, cost=1)["allowed"]
    denial_stats().flush()
    rounds = AlertRounds(None, clock=clock, pool=JobPool("browser-quotas", workers=1, waiting=5), flusher=Flusher())
    rounds.run({"acme", "zeta"}, clock())

    log_in(page)
    page.goto(TENANT)
    daily = page.locator('#tenant-quotas .quota[data-rule="quota(1000/day America/New_York)"]')
    expect(daily).to_have_class("quota quota-warning")
    expect(daily.locator(".quota-figures")).to_contain_text("850 of 1000 used (85 %), 150 left.")
    expect(daily.locator(".quota-figures")).to_contain_text(" 00:00 E")  # midnight in New York: EST or EDT
    page.wait_for_function("() => Chart.getChart(document.querySelector('#tenant-quotas canvas')) !== undefined")
    credits = page.locator('#tenant-quotas .quota:has(.label:text-is("CREDITS"))')
    expect(credits.locator(".quota-figures")).to_contain_text("850 of 5000 used")
    credits.locator('input[name="add"]').fill("250")
    credits.locator('button[type="submit"]').click()
    expect(page.locator(".messagelist")).to_contain_text("250")
    expect(credits.locator(".quota-figures")).to_contain_text("600 of 5000 used")

    page.goto("/admin/dashboard/")
    rows = page.locator("#near-quota tr.near-quota")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_have_attribute("data-key", "zeta")
    expect(rows.nth(0).locator("td.share")).to_contain_text("100 %")
    expect(rows.nth(1)).to_have_attribute("data-key", "acme")
    expect(rows.nth(1).locator("td.share")).to_contain_text("85 %")
    rows.nth(1).locator("a.tenant-link").click()
    expect(page).to_have_url(TENANT + "#tenant-quotas")

    DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for width in (1366, 390):
        page.set_viewport_size({"width": width, "height": 900})
        for name, path in {"quotas-tenant": TENANT, "quotas-dashboard": "/admin/dashboard/"}.items():
            page.goto(path)
            page.wait_for_load_state("networkidle")
            assert fits(page, width) == [], (name, width)
            target = page.locator("#tenant-quotas" if name == "quotas-tenant" else "#top-keys")
            target.screenshot(path=str(DOCS_SCREENSHOTS / f"{name}-{width}.png"))
    assert page.outside == [] and page.errors == []
