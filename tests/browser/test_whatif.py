"""Preview impact, in a real browser: on a tier's and a tenant's change page the operator
changes the form, previews, and sees which tenants the change would throttle (a table and a
chart of denials over time, now against the draft) before anything is saved.

The recorded traffic: tenant acme (tier pro: its user's burst bucket holds 50, its team bucket
1,000) sends 30 requests of one user at one instant, all allowed now. A team bucket of 10
would allow 10 of them; the free tier's user bucket of 10 would too."""

import pytest
from playwright.sync_api import expect

from core.recorder import DecisionRecorder
from policies.compile import read_policy
from policies.telemetry import install_decision_recorder, reset_decision_recorder

from .conftest import SCREENSHOTS
from .test_console import decide, log_in, operator, token  # noqa: F401  (fixtures)

pytestmark = pytest.mark.browser

REQUESTS = 30
DOCS_SCREENSHOTS = SCREENSHOTS.parent.parent.parent / "docs" / "screenshots"


@pytest.fixture
def recorded(memory_engine, load, policy_doc, clock, live_server, token):  # noqa: F811
    recorder = DecisionRecorder(clock=clock, flush_every=None)
    install_decision_recorder(recorder)
    load(policy_doc)
    answers = [decide(live_server, token, {"user": "ann", "team": "acme", "global": "*"}) for _ in range(REQUESTS)]
    assert all(answer["allowed"] for answer in answers)
    yield recorder
    reset_decision_recorder()


def set_capacity(row, capacity: int) -> None:
    """A token bucket rule row's capacity: its typed field where the form has one, else its JSON."""
    typed = row.locator('input[name$="token_bucket__capacity"]')
    if typed.count():
        typed.fill(str(capacity))
    else:
        per_second = 100
        row.locator('textarea[name$="-params"]').fill(f'{{"capacity": {capacity}, "per_second": {per_second}}}')


def rule_row(page, level: str):
    rows = page.locator("tr.form-row[id^='rules-']:not(#rules-empty)")
    # The admin's inlines.js adds this link once the whole page is parsed: on a busy machine the
    # rows were read while the last one's select was still being parsed (no level checked).
    expect(page.locator("tr.add-row a")).to_be_visible()
    for i in range(rows.count()):
        row = rows.nth(i)
        if row.locator("select[name$='-level'] option:checked").inner_text() == level:
            return row
    raise AssertionError(f"no rule row at level {level} on {page.url}: {rows.count()} rows")


def chart_totals(page):
    return dict(
        page.evaluate(
            """() => Chart.getChart(document.getElementById("whatif-chart"))
            .data.datasets.map(d => [d.label, d.data.reduce((a, b) => a + b, 0)])"""
        )
    )


def preview(page):
    page.click("#whatif-preview")
    expect(page.locator("#whatif-result")).to_be_visible()
    page.wait_for_function("() => Chart.getChart(document.getElementById('whatif-chart')) !== undefined")


def test_a_tier_change_is_previewed_on_recent_traffic_before_it_is_saved(page, recorded, operator):  # noqa: F811
    log_in(page)
    page.goto("/admin/policies/tier/")
    page.click("text=pro")
    expect(page.locator("h1")).to_contain_text("Change tier")
    version = read_policy().version
    set_capacity(rule_row(page, "team"), 10)
    preview(page)

    acme = page.locator('#whatif-tenants tr[data-tenant="acme"]')
    expect(acme.locator("td.decisions")).to_have_text(str(REQUESTS))
    expect(acme.locator("td.allowed-now")).to_have_text(str(REQUESTS))
    expect(acme.locator("td.allowed-draft")).to_have_text("10")
    expect(acme.locator("td.newly-denied")).to_have_text("20")
    expect(acme.locator("td.blocked-by")).to_contain_text("team: token_bucket(10, 100/s) ×20")
    expect(page.locator("#whatif-summary")).to_contain_text("20 newly denied")
    assert chart_totals(page) == {"denied now": 0, "denied under the draft": 20}
    # bigco overrides pro's team level: the change does not reach it, and the page says so.
    expect(page.locator('#whatif-shielded li[data-tenant="bigco"]')).to_have_text(
        "bigco overrides the team level: unaffected by this change."
    )
    # A zero is drawn as a zero: the newly allowed 0 is not in the alarm colour the 20 is in.
    colour = "(el) => getComputedStyle(el).color"
    assert acme.locator("td.newly-denied").evaluate(colour) != acme.locator("td.newly-allowed").evaluate(colour)

    # Nothing was saved: the policy is as it was, and the form still holds the change.
    assert read_policy().version == version
    assert read_policy().tiers["pro"]["team"][0]["capacity"] == 1000

    for width in (1366, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.locator("#whatif").scroll_into_view_if_needed()
        page.wait_for_timeout(200)  # Chart.js redraws on resize; nothing is timed by this
        DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(DOCS_SCREENSHOTS / f"whatif-tier-{width}.png"), full_page=True)
        # The panel fits the window (its table scrolls in its own box); the rules' inline table
        # above it is the admin form's own.
        right = page.evaluate("() => document.getElementById('whatif').getBoundingClientRect().right")
        assert right <= width, f"the preview is cut off at {width} px"
    assert page.outside == [] and page.errors == []


def test_a_tenant_moved_to_another_tier_is_previewed(page, recorded, operator):  # noqa: F811
    log_in(page)
    page.goto("/admin/policies/tenant/")
    page.click("text=acme")
    expect(page.locator("h1")).to_contain_text("Change tenant")
    page.select_option("select[name=tier]", label="free")
    page.select_option("#whatif-window", "15m")
    preview(page)
    acme = page.locator('#whatif-tenants tr[data-tenant="acme"]')
    expect(acme.locator("td.tiers")).to_contain_text("pro → free")
    expect(acme.locator("td.newly-denied")).to_have_text("20")
    expect(acme.locator("td.blocked-by")).to_contain_text("user: token_bucket(10, 1/s) ×20")
    assert read_policy().tenants["acme"].tier == "pro"
    assert page.outside == [] and page.errors == []


def test_a_form_that_would_not_save_says_why_and_replays_nothing(page, recorded, operator):  # noqa: F811
    log_in(page)
    page.goto("/admin/policies/tier/")
    page.click("text=pro")
    set_capacity(rule_row(page, "team"), -5)
    page.click("#whatif-preview")
    errors = page.locator("#whatif-errors")
    expect(errors).to_be_visible()
    expect(errors).to_contain_text("capacity")
    expect(page.locator("#whatif-result")).to_be_hidden()
    assert page.outside == [] and page.errors == []
