"""Browser tests: the console in a real headless Chromium (the Debian `chromium` package),
driven by Playwright from Python, against pytest-django's live server.

The live server runs in a thread of the test process, so the policy cache and denial
statistics that `memory_engine` installs are the ones it serves with, on the in-process
store and a clock that moves only when the test says so.

Playwright's browsers are never downloaded: Chromium is /usr/bin/chromium, which .ci/run
installs. A failing test leaves a screenshot of its page in tests/browser/screenshots/
(git-ignored).
"""

import os
import re
from pathlib import Path

import pytest

from tests.api.conftest import clock, load, memory_engine, policy_doc  # noqa: F401  (fixtures)

CHROMIUM = "/usr/bin/chromium"
# The closed network refuses Chromium's background connections (updates, sync, QUIC probes):
# without these flags it keeps trying, and a test would wait on them.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).parent / "screenshots"


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item, so that a fixture can tell a failure."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)


@pytest.fixture
def browser(monkeypatch):
    if not os.path.exists(CHROMIUM):
        pytest.fail(
            f"{CHROMIUM} is missing: the browser tests need Debian's chromium package "
            "(`apt-get install chromium`, as .ci/run does)",
            pytrace=False,
        )
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an asyncio loop in this thread while it runs, which makes
    # Django refuse the test's own ORM calls as if they came from async code. They do not:
    # every call here is synchronous. Only for this test (function scope: the loop is gone
    # before the next test, whose ORM calls Django checks again).
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, live_server, request):
    """A fresh browser page that may load nothing but the live server, and that keeps a
    screenshot when the test fails. `page.outside` lists what it tried to load elsewhere;
    `page.errors` the page's JavaScript errors."""
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.outside, page.errors = [], []

    def only_the_live_server(route):
        if route.request.url.startswith(live_server.url):
            route.continue_()
        else:
            page.outside.append(route.request.url)
            route.abort()

    context.route("**/*", only_the_live_server)
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    page.set_default_timeout(15_000)
    yield page
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        SCREENSHOTS.mkdir(exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
    context.close()
