"""Editing a tier's rules in a real browser: picking a rule type shows that type's typed
fields with their bounds and help at once, before saving; the saved rule shows on the tier's
history page as a diff, and in the policy versions; at 1366 px and 390 px nothing is cut off
(tables scroll in their own box). Screenshots of those pages go to tests/browser/screenshots."""

import pytest
from playwright.sync_api import expect

from policies.models import Tier

from .conftest import SCREENSHOTS
from .test_console import log_in, operator, tinyco  # noqa: F401  (fixtures)

pytestmark = pytest.mark.browser


def new_rule_row(page):
    """Add a rule row to the page's rules table, and return it."""
    rows = page.locator("tr.form-row.dynamic-rules")
    add = page.locator("tr.add-row a")
    # The admin's inlines.js marks the rows and adds this link once the page has loaded: count
    # the rows only then (on a busy machine the count came before it, 0 rows, then 4).
    expect(add).to_be_visible()
    before = rows.count()
    add.click()
    expect(rows).to_have_count(before + 1)
    return rows.nth(before)


def test_picking_a_rule_type_shows_its_fields_and_help_before_saving_and_the_save_shows_in_the_history(
    page, live_server, tinyco, operator
):
    free = Tier.objects.get(name="free")
    log_in(page)
    page.goto(f"/admin/policies/tier/{free.pk}/change/")

    # An existing rule shows its own type's fields, filled in.
    first = page.locator("#rules-0")
    expect(first.locator('input[name="rules-0-token_bucket__capacity"]')).to_have_value("10")
    expect(first.locator('fieldset[data-rule-type="gcra"]')).to_be_hidden()

    row = new_rule_row(page)
    parameters = row.locator(".rule-parameters")
    expect(parameters.locator(".pick-a-type")).to_be_visible()
    row.locator("select[name$='-level']").select_option(label="user")
    row.locator("select.rule-type-select").select_option("gcra")

    # At once, nothing saved: gcra's fields, their bounds and help; no other type's.
    gcra = parameters.locator('fieldset[data-rule-type="gcra"]')
    expect(gcra).to_be_visible()
    expect(gcra.locator(".rule-param").first).to_contain_text("rate")
    expect(gcra).to_contain_text("number > 0, required")
    expect(gcra).to_contain_text("Requests (or cost units) per second, sustained.")
    expect(gcra).to_contain_text("How much may go at once after a quiet spell.")
    expect(parameters.locator('fieldset[data-rule-type="token_bucket"]')).to_be_hidden()
    expect(parameters.locator(".pick-a-type")).to_be_hidden()

    # Another type: its fields replace these, its help with them.
    row.locator("select.rule-type-select").select_option("concurrency")
    concurrency = parameters.locator('fieldset[data-rule-type="concurrency"]')
    expect(concurrency).to_contain_text("integer ≥ 1, at most 1000000, required")
    expect(concurrency.locator("input[data-param=lease]")).to_have_attribute("placeholder", "60")
    expect(gcra).to_be_hidden()

    row.locator("select.rule-type-select").select_option("gcra")
    gcra.locator("input[data-param=rate]").fill("5")
    gcra.locator("input[data-param=burst]").fill("20")
    row.locator("input[name$='-label']").fill("BURST")
    row.locator("input[name$='-position']").fill("1")
    page.click('input[name="_continue"]')
    expect(page.locator(".messagelist")).to_contain_text("was changed successfully")
    assert free.rules.filter(type="gcra").get().params == {"rate": 5, "burst": 20}

    # A bad value comes back on its own field, with the type still shown.
    row = new_rule_row(page)
    row.locator("select[name$='-level']").select_option(label="team")
    row.locator("select.rule-type-select").select_option("sliding_window")
    window = row.locator('fieldset[data-rule-type="sliding_window"]')
    window.locator("input[data-param=limit]").fill("-1")
    window.locator("input[data-param=window]").fill("60")
    page.click('input[name="_continue"]')
    expect(page.locator(".errornote")).to_be_visible()
    box = page.locator(".rule-param.errors")
    expect(box).to_have_count(1)
    expect(box).to_contain_text("limit: must be greater than 0, got -1 (sliding_window)")
    expect(box.locator("xpath=ancestor::fieldset[1]")).to_be_visible()

    page.goto(f"/admin/policies/tier/{free.pk}/history/")
    latest = page.locator("#change-history tbody tr").first
    expect(latest.locator(".history-changes")).to_contain_text("user: added gcra(5/s, burst 20) [BURST]")

    page.goto("/admin/policies/policychange/")
    expect(page.locator("#result_list tbody tr").first).to_contain_text(
        "changed tier free: user: added gcra(5/s, burst 20) [BURST]"
    )
    assert page.outside == [] and page.errors == []


@pytest.mark.parametrize("width", [1366, 390])
def test_rule_pages_fit_1366_and_390_px_and_their_tables_scroll_in_their_own_box(
    page, live_server, tinyco, operator, width
):
    pro = Tier.objects.get(name="pro")
    log_in(page)
    page.goto(f"/admin/policies/tier/{pro.pk}/change/")
    rules = list(pro.rules.all())
    page.locator('input[name="rules-1-token_bucket__capacity"]').fill("60")  # a change for the history
    page.click('input[name="_continue"]')
    expect(page.locator(".messagelist")).to_contain_text("was changed successfully")
    assert pro.rules.get(pk=rules[1].pk).params["capacity"] == 60

    page.set_viewport_size({"width": width, "height": 900})
    SCREENSHOTS.mkdir(exist_ok=True)
    pages = {
        "tier": f"/admin/policies/tier/{pro.pk}/change/",
        "tier-history": f"/admin/policies/tier/{pro.pk}/history/",
        "policy-versions": "/admin/policies/policychange/",
    }
    for name, path in pages.items():
        page.goto(path)
        page.wait_for_load_state("networkidle")
        assert page.evaluate("document.documentElement.scrollWidth") <= width, name
        # A table wider than the window is in a box that scrolls it.
        cut = page.evaluate(
            """() => [...document.querySelectorAll('table')].filter(t => {
                 if (t.getBoundingClientRect().right <= window.innerWidth + 1) return false;
                 for (let box = t.parentElement; box; box = box.parentElement) {
                   const overflow = getComputedStyle(box).overflowX;
                   if (overflow === 'auto' || overflow === 'scroll') return false;
                 }
                 return true;
               }).map(t => t.id || t.className)"""
        )
        assert cut == [], (name, cut)
        page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}.png"), full_page=True)
    # The rules table fits without scrolling at all: at 1366 px as a table, at 390 px each rule
    # stacked, its parameters in sight (issue 25: they sat past the table's right edge).
    page.goto(pages["tier"])
    group = page.locator(".inline-group").first
    assert group.evaluate("box => box.scrollWidth <= box.clientWidth"), f"the rules table scrolls at {width} px"
    capacity = page.locator('input[name="rules-1-token_bucket__capacity"]')
    assert capacity.evaluate("el => el.getBoundingClientRect().right") <= width
    assert page.outside == [] and page.errors == []


@pytest.mark.parametrize("width", [1366, 390])
def test_a_revert_in_the_browser_lands_on_the_row_and_its_history_says_reverted(
    page, live_server, tinyco, operator, width
):
    """Issue 25: a revert was logged as "Changed" with reason "None", and left the operator
    on the list of tiers; times had no zone."""
    pro = Tier.objects.get(name="pro")
    first = pro.history.earliest()
    log_in(page)
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"/admin/policies/tier/{pro.pk}/change/")
    page.locator('input[name="rules-1-token_bucket__capacity"]').fill("60")
    page.click('input[name="_continue"]')
    expect(page.locator(".messagelist")).to_contain_text("was changed successfully")

    page.goto(f"/admin/policies/tier/{pro.pk}/history/{first.history_id}/")
    page.click('input[value="Revert"]')
    page.wait_for_url(f"**/admin/policies/tier/{pro.pk}/change/")
    expect(page.locator(".messagelist")).to_contain_text("Reverted the tier “pro” to its version of ")
    assert pro.rules.get(position=1, level__name="user").params["capacity"] == 50

    page.goto(f"/admin/policies/tier/{pro.pk}/history/")
    page.wait_for_load_state("networkidle")
    latest = page.locator("#change-history tbody tr").first
    expect(latest).to_contain_text("Reverted")
    expect(latest).to_contain_text("Revert to its version of ")
    expect(latest).to_contain_text(" UTC")
    expect(latest.locator(".history-changes")).to_contain_text("capacity 60 → 50")
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"tier-history-reverted-{width}.png"), full_page=True)
    assert page.outside == [] and page.errors == []
