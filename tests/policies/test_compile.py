"""Compiling rows into limiters: the same decisions as the equivalent engine config, one
limiter per tier and per tenant with overrides, and no database query when warm."""

import pytest

from core import HierarchicalLimiter, ManualClock, MemoryStore
from policies.compile import read_policy
from policies.models import Rule, Tier

from .conftest import START

pytestmark = pytest.mark.django_db

FAIL_MODES = {
    "user": {"fail_mode": "open"},
    "team": {"fail_mode": "open"},
    "global": {"fail_mode": "local", "fallback_fraction": 0.25},
}
PRIORITIES = {"interactive": {"watermark": 0.0}, "batch": {"watermark": 0.2, "levels": ["global"]}}


def engine_from_dict(config, clock):
    return HierarchicalLimiter.from_config(
        config, store=MemoryStore(), clock=clock, priorities=PRIORITIES, fail_modes=FAIL_MODES
    )


def run(decide, clock, team, requests):
    """A burst of requests from two users of `team`, a second apart in groups: the decisions."""
    out = []
    for i in range(requests):
        out.append(decide({"user": f"u{i % 2}", "team": team, "global": "*"}, 7, "batch" if i % 3 else None))
        if i % 40 == 39:
            clock.advance(1)
    return out


@pytest.mark.parametrize(
    "team, config",
    [
        (
            "acme",
            {
                "user": [
                    {"type": "sliding_window", "limit": 600, "window": 60, "label": "RPM_LIMIT"},
                    {"type": "token_bucket", "capacity": 50, "per_second": 10, "label": "BURST_LIMIT"},
                ],
                "team": [{"type": "token_bucket", "capacity": 1000, "per_second": 100}],
                "global": [{"type": "token_bucket", "capacity": 100000, "per_second": 10000}],
            },
        ),
        (
            "bigco",
            {
                "user": [
                    {"type": "sliding_window", "limit": 600, "window": 60, "label": "RPM_LIMIT"},
                    {"type": "token_bucket", "capacity": 50, "per_second": 10, "label": "BURST_LIMIT"},
                ],
                "team": [{"type": "token_bucket", "capacity": 600, "per_second": 10}],
                "global": [{"type": "token_bucket", "capacity": 100000, "per_second": 10000}],
            },
        ),
        (
            "nobody-knows-us",
            {
                "user": [{"type": "token_bucket", "capacity": 10, "per_second": 1}],
                "team": [{"type": "token_bucket", "capacity": 100, "per_second": 10}],
                "global": [{"type": "token_bucket", "capacity": 100000, "per_second": 10000}],
            },
        ),
    ],
)
def test_rows_decide_as_the_equivalent_engine_config(load, policy, worker, clock, team, config):
    load(policy)
    from_rows = run(worker().decide, clock, team, 200)

    engine_clock = ManualClock(START.timestamp())  # the same run on a clock of its own
    engine = engine_from_dict(config, engine_clock)
    from_dict = run(engine.acquire, engine_clock, team, 200)

    assert from_rows == from_dict
    assert any(not d.allowed for d in from_rows) and any(d.allowed for d in from_rows)


def test_the_policy_reads_the_rows_as_the_engine_config(load, policy):
    load(policy)
    read = read_policy()
    assert read.levels == ("user", "team", "global")
    assert read.default_tier == "free"
    assert read.config("pro", read.tenants["bigco"].overrides)["team"] == [
        {"type": "token_bucket", "capacity": 600, "per_second": 10}
    ]
    assert read.priorities == PRIORITIES
    assert read.fail_modes["global"] == {"fail_mode": "local", "fallback_fraction": 0.25}


def test_an_unknown_tenant_gets_the_default_tier(load, policy, worker):
    load(policy)
    cache = worker()
    assert cache.limiter_for("stranger") is cache.limiter_for(None)
    assert cache.limiter_for("stranger").levels["team"][0].capacity == 100


def test_tenants_of_one_tier_share_its_limiter_and_overrides_get_their_own(load, policy, worker):
    policy["tenants"]["initech"] = {"tier": "pro"}
    load(policy)
    cache = worker()
    assert cache.limiter_for("acme") is cache.limiter_for("initech")
    assert cache.limiter_for("bigco") is not cache.limiter_for("acme")


def test_overrides_replace_only_their_level(load, policy, worker):
    load(policy)
    limiter = worker().limiter_for("bigco")
    assert [r.describe() for r in limiter.levels["team"]] == ["token_bucket(600, 10/s)"]
    assert [r.type_name for r in limiter.levels["user"]] == ["sliding_window", "token_bucket"]


def test_global_rules_apply_to_every_tier(load, policy, worker):
    load(policy)
    cache = worker()
    for team in ("acme", "bigco", "stranger"):
        assert [r.describe() for r in cache.limiter_for(team).levels["global"]] == ["token_bucket(100000, 10000/s)"]


def test_a_denial_names_the_level_and_rule(load, policy, worker):
    load(policy)
    cache = worker()
    keys = {"user": "u1", "team": "acme", "global": "*"}
    decisions = [cache.decide(keys, 10) for _ in range(6)]
    assert decisions[-1].allowed is False
    assert decisions[-1].blocked_by == "user: token_bucket(50, 10/s)"
    assert decisions[-1].reason == "BURST_LIMIT"


def test_a_warm_decision_does_no_database_query(load, policy, worker, django_assert_num_queries, clock):
    load(policy)
    cache = worker()
    keys = {"user": "u1", "team": "acme", "global": "*"}
    cache.decide(keys, 1)
    clock.advance(0.4)
    with django_assert_num_queries(0):
        assert cache.decide(keys, 1).allowed
        assert cache.decide({"user": "u2", "team": "stranger", "global": "*"}, 1, "batch").allowed


def test_a_version_check_is_one_query_and_an_unchanged_policy_is_not_read_again(
    load, policy, worker, django_assert_num_queries, clock
):
    load(policy)
    cache = worker()
    keys = {"user": "u1", "team": "acme", "global": "*"}
    limiter = cache.limiter_for("acme")
    clock.advance(0.5)
    with django_assert_num_queries(1):
        assert cache.decide(keys, 1).allowed
    assert cache.limiter_for("acme") is limiter


def test_all_limiters_share_one_store(load, policy, worker, store):
    load(policy)
    cache = worker()
    assert cache.limiter_for("acme").store is store is cache.limiter_for("bigco").store


def test_a_tier_with_no_tenant_and_no_default_has_only_global_rules(load, policy, worker):
    del policy["default_tier"]
    load(policy)
    limiter = worker().limiter_for("stranger")
    assert {level: len(rules) for level, rules in limiter.levels.items()} == {"user": 0, "team": 0, "global": 1}


def test_the_process_cache_uses_the_process_store():
    from policies.compile import policy_cache
    from policies.stores import limiter_store

    assert policy_cache().store is limiter_store()


def test_rules_keep_their_position_order(load, policy, worker):
    load(policy)
    pro = Tier.objects.get(name="pro")
    Rule.objects.filter(tier=pro, type="sliding_window").update(position=5)
    worker_ = worker()
    assert [r.type_name for r in worker_.limiter_for("acme").levels["user"]] == ["token_bucket", "sliding_window"]


def test_under_django_each_redis_alias_keeps_its_own_timeouts(settings, redis_url):
    from django.core.cache import caches

    from core.stores.redis import RedisStore
    from limiter_admin.settings import _caches
    from policies.stores import limiter_store

    settings.REDIS_URL = redis_url
    settings.CACHES = _caches(redis_url, 0.05, 1.0)
    caches._settings = None
    limiter_store.cache_clear()
    try:
        store = limiter_store()
        assert isinstance(store, RedisStore)
        assert store.batch_client is not store.client
        assert store.batch_client.connection_pool.connection_kwargs["socket_timeout"] == 1.0
        assert store.client.connection_pool.connection_kwargs["socket_timeout"] == 0.05
        # The ordinary cache keeps redis-py's patience: django-redis alone would share one pool.
        from django_redis import get_redis_connection

        assert get_redis_connection("default").connection_pool.connection_kwargs.get("socket_timeout") is None
    finally:
        limiter_store.cache_clear()
