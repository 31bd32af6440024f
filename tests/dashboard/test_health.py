"""Panel 3: is the limiter healthy, and what happens if its store dies."""

import pytest
from django.contrib.admin.models import LogEntry

from core.stats import DenialStats
from core.stores.redis import RedisStore
from policies.compile import PolicyCache, install_policy_cache
from policies.models import Level, PriorityClass
from policies.telemetry import install_denial_stats
from tests.dashboard.conftest import DASHBOARD, decide, page, text

HEALTH = DASHBOARD + "health/"


def section(html, element_id):
    start = html.index(f'id="{element_id}"')
    return text(
        html[html.index(">", start) + 1 : html.index("</table>", start) if "</table>" in html[start:] else None]
    )


def test_the_store_is_up(api, console):
    html = page(console, HEALTH)
    assert 'data-up="true"' in html
    assert "Store (Redis): up: decisions are made on it." in text(html)
    assert f'hx-get="{HEALTH}" hx-trigger="every 5s" hx-swap="outerHTML"' in html


def test_the_in_process_store_is_up(memory_engine, load, policy_doc, console):
    load(policy_doc)
    assert "Store (in-process memory, this process only): up" in text(page(console, HEALTH))


def test_each_levels_fail_mode_is_shown_with_a_link_to_edit_it(api, console):
    html = page(console, HEALTH)
    modes = section(html, "fail-modes")
    assert "user open allows every request edit" in modes
    assert "team open allows every request edit" in modes
    assert "global local limits in each process at 25% of the rules edit" in modes
    for level in Level.objects.all():
        assert f'href="/admin/policies/level/{level.pk}/change/" class="changelink">edit</a>' in html


def test_a_fail_mode_changed_in_the_policy_shows_at_once(api, load, policy_doc, console):
    policy_doc["levels"][1]["fail_mode"] = "closed"
    load(policy_doc)
    api.refresh()
    assert "team closed denies every request (retry after about 1 s)" in section(page(console, HEALTH), "fail-modes")


def test_priority_classes_are_shown_with_their_watermarks_and_levels(api, console):
    html = page(console, HEALTH)
    classes = section(html, "priorities")
    assert "batch 0.2 (keeps 20 % of each rule) global edit" in classes
    assert "interactive 0 (keeps 0 % of each rule) global (default) edit" in classes
    batch = PriorityClass.objects.get(name="batch")
    assert f'href="/admin/policies/priorityclass/{batch.pk}/change/"' in html


def test_decision_and_denial_rates_come_from_the_statistics(api, decide_client, console):
    for _ in range(13):
        decide(decide_client, {"user": "greedy", "team": "nobody"})
    for _ in range(2):
        decide(decide_client, {"team": "acme"}, cost=1001)
    rates = section(page(console, HEALTH), "rates")
    # 15 decisions and 5 denials over the 300 s the 5-minute report covers, and over 3,600 s.
    assert "5 min 0.05 0.0167 33.3 % 15 5" in rates
    assert "1 h 0.00417 0.00139 33.3 % 15 5" in rates


@pytest.fixture
def store_down(db, load, policy_doc, unreachable_redis_url):
    """The policy in the database, and a limiter whose Redis does not answer."""
    load(policy_doc)
    store = RedisStore(url=unreachable_redis_url)
    install_policy_cache(PolicyCache(store=store))
    install_denial_stats(DenialStats(client=store.client, flush_every=None))
    yield store
    install_policy_cache(None)
    install_denial_stats(None)
    store.close()


def test_a_dead_store_shows_as_degraded_since_its_first_failure(store_down, console):
    html = page(console, HEALTH)
    assert 'data-up="false"' in html
    words = text(html)
    assert "Store (Redis): degraded since " in words
    assert "failed call in a row): decisions follow each level's fail mode below." in words
    assert store_down.breaker.down_since is not None
    assert "global local limits in each process at 25% of the rules" in words  # what happens now


def test_the_whole_dashboard_still_answers_while_the_store_is_down(store_down, console):
    html = page(console, level="team", key="acme", cost="1")
    words = text(html)
    assert "the statistics cannot be read:" in words
    assert "The store is unreachable, so the live state cannot be read:" in words
    assert "The store is unreachable:" in words  # the dry run
    assert "Store (Redis): degraded since" in words


def test_a_reset_while_the_store_is_down_says_nothing_was_reset(store_down, console):
    response = console.post(DASHBOARD + "reset/", {"level": "team", "key": "acme"})
    assert response.status_code == 200
    assert "Nothing was reset: the store is unreachable" in response.content.decode()
    assert not LogEntry.objects.exists()


@pytest.fixture
def on_a_cluster(db, load, policy_doc, redis_cluster_url):
    """The policy in the database, and a limiter on the session's Redis Cluster."""
    from core.stores.cluster import ClusterStore

    load(policy_doc)
    store = ClusterStore(url=redis_cluster_url, timeout=1.0)
    install_policy_cache(PolicyCache(store=store))
    yield store
    install_policy_cache(None)
    store.close()


def test_a_cluster_shows_each_primary_as_its_store_reports_it(on_a_cluster, console):
    words = text(page(console, HEALTH))
    primaries = [part["name"] for part in on_a_cluster.health()]
    assert len(primaries) == 3
    for name in primaries:
        assert f"Store ({name}): up: decisions are made on it." in words
