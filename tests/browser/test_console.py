"""The operators' console in a real browser: log in, watch a tenant get throttled, read its
buckets, change its limit in the admin and see the next decision change."""

import json
import urllib.error
import urllib.request

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from tests.api.conftest import make_token

pytestmark = pytest.mark.browser

TINY_RULE = "team: token_bucket(3, 1/s)"


def decide(live_server, token, keys, cost=1):
    """POST /api/v1/decisions as a gateway would, with its decide token."""
    request = urllib.request.Request(
        f"{live_server.url}/api/v1/decisions",
        data=json.dumps({"keys": keys, "cost": cost}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture
def tinyco(memory_engine, load, policy_doc):
    """The example policy, plus tenant tinyco whose team bucket holds 3."""
    policy_doc["tenants"]["tinyco"] = {
        "tier": "free",
        "overrides": {"team": [{"type": "token_bucket", "capacity": 3, "per_second": 1}]},
    }
    load(policy_doc)
    return memory_engine


@pytest.fixture
def token(db):
    return make_token("decide")


@pytest.fixture
def operator(db):
    return get_user_model().objects.create_superuser("operator", password="pw-for-tests")


def log_in(page):
    page.goto("/admin/")
    expect(page).to_have_url("/admin/login/?next=/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "pw-for-tests")
    page.click("input[type=submit]")
    expect(page.locator("#dashboard-link")).to_be_visible()


def chart_series(page):
    """The blocked_by chart's datasets as Chart.js holds them: label -> total denials."""
    return dict(
        page.evaluate("""() => Chart.getChart(document.getElementById("blocked-chart"))
        .data.datasets.map(d => [d.label, d.data.reduce((a, b) => a + b, 0)])""")
    )


def test_an_operator_sees_a_tenant_throttled_reads_its_buckets_and_raises_its_limit(
    page, live_server, tinyco, token, operator, clock
):
    log_in(page)
    page.click("#dashboard-link")
    expect(page).to_have_url("/admin/dashboard/")
    expect(page.locator("#throttled")).to_contain_text("Nobody was throttled in the last 1 h.")
    page.evaluate("window.loadedOnce = true")  # gone if the page were loaded again

    # The gateway asks five times; the tenant's bucket holds three.
    answers = [decide(live_server, token, {"team": "tinyco"}) for _ in range(5)]
    assert [answer["allowed"] for answer in answers] == [True, True, True, False, False]
    assert answers[-1]["blocked_by"] == TINY_RULE

    # The throttled panel refreshes itself (htmx, every 10 s): the tenant, then the chart.
    row = page.locator('#top-keys [data-level="tenants"] tr[data-key="tinyco"]')
    expect(row.locator("td.denied")).to_have_text("2", timeout=20_000)
    expect(page.locator("#blocked-by")).to_contain_text(TINY_RULE)
    assert chart_series(page) == {TINY_RULE: 2}
    assert page.evaluate("window.loadedOnce") is True

    # Its live buckets: the override's three tokens, all taken.
    row.locator("a.buckets-link").click()
    expect(page).to_have_url("/admin/dashboard/?level=team&key=tinyco#buckets")
    bucket = page.locator('tr.bucket-rule[data-rule="token_bucket(3, 1/s)"]')
    expect(bucket.locator("td.source")).to_have_text("override: tinyco")
    expect(bucket.locator("td.state")).to_contain_text("0 / 3 tokens left")
    expect(bucket.locator("td.full-in")).to_have_text("3 s")

    # Two seconds later the bucket panel shows the refill by itself, without a reload.
    page.evaluate("window.loadedOnce = true")
    clock.advance(2)
    expect(bucket.locator("td.state")).to_contain_text("2 / 3 tokens left", timeout=10_000)
    assert page.evaluate("window.loadedOnce") is True

    # A request of cost 5 can never fit a bucket of 3.
    before = decide(live_server, token, {"team": "tinyco"}, cost=5)
    assert not before["allowed"] and before["reason"] == "COST_EXCEEDS_LIMIT"

    # The operator raises the tenant's limit on its admin page.
    page.click("#bucket-route a.tenant-link")
    expect(page.locator("h1")).to_contain_text("Change tenant")
    page.fill('input[name="rules-0-token_bucket__capacity"]', "10")
    page.click('input[name="_save"]')
    expect(page.locator(".messagelist")).to_contain_text("was changed successfully")

    clock.advance(1)  # workers notice a policy change within half a second
    after = decide(live_server, token, {"team": "tinyco"}, cost=5)
    assert after["allowed"] and after["remaining"] == 5

    page.goto("/admin/dashboard/?level=team&key=tinyco#buckets")
    bucket = page.locator('tr.bucket-rule[data-rule="token_bucket(10, 1/s)"]')
    expect(bucket.locator("td.source")).to_have_text("override: tinyco")
    expect(bucket.locator("td.state")).to_contain_text("5 / 10 tokens left")
    expect(page.locator('tr.bucket-rule[data-rule="token_bucket(3, 1/s)"]')).to_have_count(0)

    assert page.outside == [] and page.errors == []


def test_a_reset_is_confirmed_in_the_browser_and_a_dry_run_answers_in_place(page, live_server, tinyco, token, operator):
    for _ in range(3):
        decide(live_server, token, {"team": "tinyco"})
    log_in(page)
    page.goto("/admin/dashboard/?level=team&key=tinyco#buckets")
    bucket = page.locator('tr.bucket-rule[data-rule="token_bucket(3, 1/s)"]')
    expect(bucket.locator("td.state")).to_contain_text("0 / 3 tokens left")

    # A dry run answers in place (htmx) and takes nothing.
    page.evaluate("window.loadedOnce = true")
    page.fill("#dry-run-form input[name=cost]", "2")
    page.click("#dry-run-form input[type=submit]")
    decision = page.locator("#dry-run-decision")
    expect(decision).to_have_attribute("data-allowed", "false")
    expect(decision.locator(".blocked-by")).to_have_text(TINY_RULE)
    expect(decision.locator(".retry-after")).to_have_text("2 s")
    assert page.evaluate("window.loadedOnce") is True
    expect(bucket.locator("td.state")).to_contain_text("0 / 3 tokens left")

    # Reset: a confirmation page first, then the buckets are full again.
    page.click("#reset-link")
    expect(page.locator("#content-main")).to_contain_text("Reset every bucket of team: tinyco?")
    page.click('#reset-form input[type="submit"]')
    expect(page.locator(".messagelist")).to_contain_text("The buckets of tinyco were reset")
    expect(page.locator('tr.bucket-rule[data-rule="token_bucket(3, 1/s)"] td.state')).to_contain_text(
        "3 / 3 tokens left"
    )
    assert decide(live_server, token, {"team": "tinyco"})["allowed"]

    assert page.outside == [] and page.errors == []
