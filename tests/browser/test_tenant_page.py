"""The tenant page and the dashboard's search in a real browser: the chart draws, the live
buckets refresh by themselves, the search box suggests as the operator types, a quick raise
applies to the next decision, and at 1366 px and 390 px nothing is cut off."""

import pytest
from playwright.sync_api import expect

from .conftest import SCREENSHOTS
from .test_console import decide, log_in, operator, tinyco, token  # noqa: F401  (fixtures)

pytestmark = pytest.mark.browser

TENANT = "/admin/dashboard/tenants/tinyco/"


def usage_series(page, chart_id):
    """The tenant chart's datasets as Chart.js holds them: label -> total."""
    return dict(
        page.evaluate(
            """(id) => Chart.getChart(document.getElementById(id))
            .data.datasets.map(d => [d.label, d.data.reduce((a, b) => a + b, 0)])""",
            chart_id,
        )
    )


def test_the_tenant_page_draws_its_charts_and_its_buckets_refresh_themselves(
    page, live_server, tinyco, token, operator, clock
):
    answers = [decide(live_server, token, {"user": "ann", "team": "tinyco"}) for _ in range(5)]
    assert [a["allowed"] for a in answers] == [True, True, True, False, False]
    log_in(page)
    page.goto(TENANT)
    expect(page.locator("h1")).to_contain_text("Tenant tinyco")
    page.wait_for_function("() => Chart.getChart(document.getElementById('usage-24h-chart')) !== undefined")
    assert usage_series(page, "usage-24h-chart") == {"allowed": 3, "denied": 2}
    assert usage_series(page, "usage-30days-chart") == {"allowed": 3, "denied": 2}
    expect(page.locator("#top-users tr[data-user=ann] td.denied")).to_have_text("2")
    expect(page.locator("#tenant-blocked-by")).to_contain_text("team: token_bucket(3, 1/s)")

    bucket = page.locator('tr.bucket-rule[data-rule="token_bucket(3, 1/s)"]')
    expect(bucket.locator("td.state")).to_contain_text("0 / 3 tokens left")
    page.evaluate("window.loadedOnce = true")
    clock.advance(2)
    expect(bucket.locator("td.state")).to_contain_text("2 / 3 tokens left", timeout=10_000)
    assert page.evaluate("window.loadedOnce") is True
    assert page.outside == [] and page.errors == []


def test_the_search_box_suggests_tenants_and_users_as_you_type(page, live_server, tinyco, token, operator):
    decide(live_server, token, {"user": "tina", "team": "acme"})
    log_in(page)
    page.goto("/admin/dashboard/")
    page.locator("#search-box").press_sequentially("ti", delay=50)
    suggestions = page.locator("#search-suggestions")
    expect(suggestions.locator('li.tenant[data-tenant="tinyco"]')).to_be_visible()
    expect(suggestions.locator('li.user[data-user="tina"]')).to_contain_text("acme / tina")
    page.locator("#search-box").press_sequentially("ny", delay=50)
    expect(suggestions.locator('li.user[data-user="tina"]')).to_have_count(0)
    suggestions.locator('li.tenant[data-tenant="tinyco"] a').click()
    expect(page).to_have_url(TENANT)
    assert page.outside == [] and page.errors == []


def test_a_quick_raise_applies_to_the_next_decision(page, live_server, tinyco, token, operator, clock):
    assert not decide(live_server, token, {"team": "acme"}, cost=1500)["allowed"]  # pro: a bucket of 1000
    log_in(page)
    page.goto("/admin/dashboard/tenants/acme/")
    row = page.locator('tr.effective-rule[data-level="team"][data-rule="token_bucket(1000, 100/s)"]')
    expect(row.locator("td.source")).to_have_text("tier: pro")
    row.locator('select[name="factor"]').select_option("2")
    row.locator('input[name="hours"]').fill("2")
    row.locator('input[type="submit"]').click()
    expect(page.locator(".messagelist")).to_contain_text(
        "Raised team: token_bucket(1000, 100/s) x2 to token_bucket(2000, 200/s) for acme until"
    )
    raised = page.locator('tr.effective-rule[data-rule="token_bucket(2000, 200/s)"] td.source')
    expect(raised).to_contain_text("override: acme, until")
    clock.advance(1)  # workers notice a policy change within half a second
    after = decide(live_server, token, {"team": "acme"}, cost=1500)
    assert after["allowed"] and after["remaining"] == 500
    assert page.outside == [] and page.errors == []


@pytest.mark.parametrize("width", [1366, 390])
def test_nothing_is_cut_off_at_1366_and_390_px(page, live_server, tinyco, token, operator, width):
    for user in ("ann", "a-user-with-a-rather-long-identifier-0123456789"):
        for _ in range(5):
            decide(live_server, token, {"user": user, "team": "tinyco"})
        for _ in range(12):  # the free user bucket holds 10: users in the users' table too
            decide(live_server, token, {"user": user, "team": "a-team-key-of-some-length"})
    log_in(page)
    page.set_viewport_size({"width": width, "height": 900})
    SCREENSHOTS.mkdir(exist_ok=True)
    for name, path in (("dashboard", "/admin/dashboard/?level=team&key=tinyco"), ("tenant", TENANT)):
        page.goto(path)
        page.wait_for_load_state("networkidle")
        # The page itself never scrolls sideways: wide tables scroll inside their own box.
        assert page.evaluate("document.documentElement.scrollWidth") <= width, name
        overflowing = page.evaluate(
            """() => [...document.querySelectorAll('table')].filter(t => {
                 const box = t.closest('.table-scroll');
                 return t.getBoundingClientRect().right > window.innerWidth + 1 && !box;
               }).map(t => t.id || t.className)"""
        )
        assert overflowing == [], (name, overflowing)
        page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}.png"), full_page=True)
    # acme's rules can be raised: the Raise control in sight, not past a table's edge (issue 25).
    page.goto("/admin/dashboard/tenants/acme/")
    button = page.locator('#effective-rules input[value="Raise"]').first
    assert button.evaluate("el => el.getBoundingClientRect().right") <= width
    assert page.outside == [] and page.errors == []
