"""Alerts in a real browser: an operator adds an alert (a bad URL is refused on its field and
nothing is saved), sends a test to a real receiver on loopback, and reads the delivery log of
a firing that failed once and was delivered on its retry. Screenshots of the alert's page and
of the list at 1366 and 390 px wide go to docs/screenshots/."""

import hashlib
import hmac
import time
from concurrent.futures import wait

import pytest
from playwright.sync_api import expect

from core.flusher import Flusher
from policies.models import Alert, AlertDelivery, AlertFiring
from policies.services.alerts import AlertRounds, backoff
from policies.services.jobs import JobPool
from policies.telemetry import denial_stats
from tests.receiver import WAIT, Receiver

from .conftest import SCREENSHOTS
from .test_console import decide, log_in, operator, tinyco, token  # noqa: F401  (fixtures)

pytestmark = pytest.mark.browser

DOCS_SCREENSHOTS = SCREENSHOTS.parent.parent.parent / "docs" / "screenshots"
SECRET = "browser-secret-5e1"


@pytest.fixture
def receiver():
    with Receiver() as receiver:
        yield receiver


def fill_alert(page, url: str) -> None:
    page.fill("#id_name", "tinyco-denials")
    page.select_option("#id_kind", "denied_share")
    page.fill("#id_threshold", "0.2")
    page.fill("#id_window", "5m")
    page.fill("#id_url", url)
    page.fill("#id_secret", SECRET)


def fits(page, width: int) -> list[str]:
    """What is cut off at `width`: the page itself wider than the window, or a table wider than
    it that no box scrolls."""
    cut = page.evaluate(
        """() => [...document.querySelectorAll('table')].filter(t => {
             if (t.getBoundingClientRect().right <= window.innerWidth + 1) return false;
             for (let box = t.parentElement; box; box = box.parentElement) {
               const overflow = getComputedStyle(box).overflowX;
               if (overflow === 'auto' || overflow === 'scroll') return false;
             }
             return true;
           }).map(t => t.id || t.className || 'table')"""
    )
    if page.evaluate("document.documentElement.scrollWidth") > width:
        cut.append("the page")
    return cut


def test_an_operator_adds_an_alert_tests_it_and_reads_its_delivery_log(
    page,
    live_server,
    tinyco,
    operator,
    token,
    receiver,
    clock,  # noqa: F811
):
    log_in(page)
    page.goto("/admin/policies/alert/add/")
    fill_alert(page, "ftp://files.example.com/hook")
    page.click('input[name="_continue"]')
    expect(page.locator(".field-url .errorlist")).to_contain_text("must be an http:// or https:// URL, not ftp:")
    assert not Alert.objects.exists()
    page.fill("#id_url", receiver.url)
    page.fill("#id_secret", SECRET)  # a password field is not filled in again
    page.click('input[name="_continue"]')
    expect(page.locator(".messagelist")).to_contain_text("was added successfully")
    alert = Alert.objects.get()

    page.click("form.send-test button")
    expect(page.locator(".messagelist")).to_contain_text("Test delivered")
    [test] = receiver.wait_for(1)
    sent = test.headers["X-Limiter-Signature"].removeprefix("sha256=")
    assert hmac.compare_digest(sent, hmac.new(SECRET.encode(), test.body, hashlib.sha256).hexdigest())

    # tinyco's team bucket holds 3: 8 requests, 5 denied. The worker's round fires; the
    # receiver fails the first attempt and takes the retry. (The console's test send was
    # stamped by the wall clock: the decisions' clock goes on from there.)
    clock.advance(time.time() + 1 - clock())
    answers = [decide(live_server, token, {"user": "ann", "team": "tinyco", "global": "*"}) for _ in range(8)]
    assert [answer["allowed"] for answer in answers].count(False) == 5
    denial_stats().flush()
    receiver.statuses = [500]
    rounds = AlertRounds(None, clock=clock, pool=JobPool("browser-alerts", workers=1, waiting=5), flusher=Flusher())
    rounds.run({"tinyco"}, clock())
    wait(rounds.dispatched, timeout=WAIT)
    clock.advance(backoff(1))
    rounds.run(set(), clock())
    wait(rounds.dispatched, timeout=WAIT)
    assert AlertFiring.objects.get().state == "delivered"
    assert AlertDelivery.objects.count() == 3

    page.goto(f"/admin/policies/alert/{alert.pk}/change/")
    log = page.locator(".delivery-log tbody tr")
    expect(log).to_have_count(3)
    expect(log.nth(0)).to_contain_text("tinyco: 62% denied")
    expect(log.nth(0)).to_contain_text("delivered (200)")
    expect(log.nth(1)).to_contain_text("HTTP 500 Internal Server Error")
    expect(log.nth(2)).to_contain_text("test")

    DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    pages = {"alert": f"/admin/policies/alert/{alert.pk}/change/", "alerts": "/admin/policies/alert/"}
    for width in (1366, 390):
        page.set_viewport_size({"width": width, "height": 900})
        for name, path in pages.items():
            page.goto(path)
            page.wait_for_load_state("networkidle")
            assert fits(page, width) == [], (name, width)
            page.screenshot(path=str(DOCS_SCREENSHOTS / f"{name}-{width}.png"), full_page=True)
    assert page.outside == [] and page.errors == []
