"""The page as a whole: local static files only, vendored libraries with their licences,
and work that does not grow with the number of keys in the store."""

import time
from html.parser import HTMLParser
from pathlib import Path

import redis
from django.contrib.staticfiles import finders

from tests.dashboard.conftest import DASHBOARD, decide, page

VENDORED = {
    "vendor/htmx/htmx.min.js": "vendor/htmx/LICENSE",
    "vendor/chartjs/chart.umd.min.js": "vendor/chartjs/LICENSE.md",
}


class References(HTMLParser):
    """Every URL a page makes the browser load, and its scripts."""

    def __init__(self):
        super().__init__()
        self.loaded, self.scripts = [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("script", "img", "iframe", "source", "audio", "video", "embed") and attrs.get("src"):
            self.loaded.append(attrs["src"])
        if tag == "link" and attrs.get("href"):
            self.loaded.append(attrs["href"])
        if tag == "object" and attrs.get("data"):
            self.loaded.append(attrs["data"])
        if tag == "script":
            self.scripts.append(attrs)


def references(html):
    parser = References()
    parser.feed(html)
    return parser


def test_the_dashboard_loads_only_local_static_files(api, decide_client, console):
    decide(decide_client, {"team": "acme"}, cost=1001)
    for html in (
        page(console, level="team", key="acme", cost="1"),
        page(console, "/admin/"),
        page(console, DASHBOARD + "reset/", level="team", key="acme"),
    ):
        found = references(html)
        assert found.loaded
        for url in found.loaded:
            assert url.startswith("/static/") and not url.startswith("//"), url
            assert finders.find(url.removeprefix("/static/")), f"{url} is not a static file of the project"
        assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in html


def test_the_dashboard_loads_htmx_and_chart_js_from_the_vendored_files(api, console):
    found = references(page(console))
    assert {
        "/static/vendor/htmx/htmx.min.js",
        "/static/vendor/chartjs/chart.umd.min.js",
        "/static/limiter_admin/dashboard.js",
    } <= set(found.loaded)


def test_the_page_has_no_inline_script_only_its_chart_data(api, console):
    for script in references(page(console)).scripts:
        assert script.get("src") or script.get("type") == "application/json", script


def test_each_vendored_library_comes_with_its_licence(api):
    for library, licence in VENDORED.items():
        assert finders.find(library) and finders.find(licence)
        assert "Permission" in Path(finders.find(licence)).read_text()
    assert "Chart.js v4." in Path(finders.find("vendor/chartjs/chart.umd.min.js")).read_text()[:200]


def commands(client):
    """Redis commands run since the last reset, by name."""
    return {name.removeprefix("cmdstat_"): stats["calls"] for name, stats in client.info("commandstats").items()}


def render_everything(console):
    page(console, level="user", key="u1", team="acme", cost="2", priority="batch")
    for window in ("5m", "1h", "24h"):
        page(console, DASHBOARD + "throttled/", window=window)
    page(console, DASHBOARD + "buckets/", level="team", key="acme")
    page(console, DASHBOARD + "health/")


def test_the_work_of_a_page_does_not_grow_with_the_keys_in_the_store(api, decide_client, console, redis_url):
    for n in range(30):
        decide(decide_client, {"user": f"u{n % 7}", "team": "acme", "global": "*"}, cost=20)
    client = redis.Redis.from_url(redis_url)
    render_everything(console)  # warm: scripts loaded, levels known
    client.config_resetstat()
    render_everything(console)
    few = commands(client)
    with client.pipeline(transaction=False) as pipe:
        for n in range(100_000):
            pipe.set(f"la:{{team:tenant-{n}}}:tb", "1")
            if n % 10_000 == 9_999:
                pipe.execute()
    assert client.dbsize() > 100_000
    client.config_resetstat()
    started = time.perf_counter()
    render_everything(console)
    elapsed = time.perf_counter() - started
    many = commands(client)
    assert not {"keys", "scan", "sscan", "hscan", "zscan", "dbsize", "randomkey"} & set(many)
    many.pop("config|resetstat", None), few.pop("config|resetstat", None)
    assert many == few  # the same reads, one for one, whatever the store holds
    assert elapsed < 10  # six pages; a loose bound for a busy test machine
    client.close()
