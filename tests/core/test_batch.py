"""Batches: many decisions in one call, each the decision `acquire` would make were the
requests made one after the other, in one round trip on Redis. Every test using `build` runs
on the in-process store and on a real Redis."""

import math
import random
import threading

import pytest
import redis

from core import HierarchicalLimiter, InvalidRequest, ManualClock, Param, Rule, acquire_batch, register
from core.limiter import acquire_batch as acquire_batch_from_limiter
from core.stores.redis import RedisStore

from .helpers import (
    concurrency,
    fixed_window,
    gcra,
    move_to,
    register_lifetime_quota,
    sliding_window,
    sliding_window_counter,
    state_of,
    token_bucket,
)
from .lua_loss import losing_the_lua, redis_without_functions  # noqa: F401 (fixtures)

CONFIG = {
    "user": [token_bucket(3, 1, label="USER_BURST"), sliding_window(4, 10, counts="requests")],
    "team": [gcra(1, 2.5), fixed_window(5, 5), concurrency(3, lease=7)],
    "global": [sliding_window_counter(8, 4), token_bucket(2, 0.5, shadow=True)],
}
PRIORITIES = {"batch": {"watermark": 0.25, "levels": ["team", "global"]}}
KEY_SETS = [
    {"user": "ann", "team": "red", "global": "*"},
    {"user": "bob", "team": "red"},
    {"user": "ann"},
    {"team": "blue", "global": "*"},
    {"global": "*"},
]


def requests(rng, count):
    return [
        (rng.choice(KEY_SETS), rng.choice([1, 1, 0.5, 2, 2.5]), rng.choice([None, None, "batch"])) for _ in range(count)
    ]


def assert_same(batched, one_by_one):
    assert batched == one_by_one  # Decision equality leaves out lease ids, unique by design
    assert [d.lease is None for d in batched] == [d.lease is None for d in one_by_one]


def test_acquire_batch_is_importable_from_the_limiter_module():
    assert acquire_batch is acquire_batch_from_limiter


def test_a_batch_decides_in_order_as_if_one_after_the_other(build):
    limiter = build({"user": [token_bucket(3, 0)]})
    decisions = acquire_batch([(limiter, {"user": "u"})] * 5)
    assert [d.allowed for d in decisions] == [True, True, True, False, False]
    assert [d.remaining for d in decisions] == [2, 1, 0, 0, 0]


def test_an_empty_batch_decides_nothing(build):
    assert acquire_batch([]) == []


@pytest.mark.parametrize("seed", range(4))
def test_a_batch_equals_the_same_requests_made_one_by_one(build, clock, seed):
    rng = random.Random(seed)
    batched = build(CONFIG, priorities=PRIORITIES)
    one_by_one = build(CONFIG, priorities=PRIORITIES)
    for _ in range(12):
        items = requests(rng, rng.randrange(1, 12))
        assert_same(acquire_batch([(batched, *item) for item in items]), [one_by_one.acquire(*item) for item in items])
        clock.advance(rng.choice([0, 0.25, 0.5, 1, 2.5, 5]))


def test_a_batch_mixes_tenants_whose_limiters_share_one_store(build, clock):
    free = {"user": [token_bucket(2, 1)], "team": [token_bucket(4, 1)], "global": [token_bucket(6, 0)]}
    pro = {"user": [sliding_window(5, 10)], "team": [fixed_window(10, 10)], "global": [token_bucket(6, 0)]}
    rng = random.Random(7)
    shared = build(free)
    tenants = {"free": shared, "pro": build(pro, store=shared.store)}
    alone = build(free)
    alone_tenants = {"free": alone, "pro": build(pro, store=alone.store)}
    for _ in range(6):
        items = [
            (rng.choice(["free", "pro"]), {"user": rng.choice("ab"), "team": "t", "global": "*"})
            for _ in range(rng.randrange(1, 8))
        ]
        assert_same(
            acquire_batch([(tenants[tier], keys, 1, None) for tier, keys in items]),
            [alone_tenants[tier].acquire(keys) for tier, keys in items],
        )
        clock.advance(1)
    # The global bucket never refills and both tiers share it: six in all, whatever the tier.
    assert state_of(shared, "global", "*")["tokens"] == 0


def test_a_batch_hands_out_leases_that_release_their_slots(build):
    limiter = build({"user": [concurrency(2)]})
    decisions = acquire_batch([(limiter, {"user": "u"})] * 3)
    assert [d.allowed for d in decisions] == [True, True, False]
    assert decisions[0].lease != decisions[1].lease and decisions[2].lease is None
    assert limiter.release({"user": "u"}, decisions[0].lease) == 1
    assert acquire_batch([(limiter, {"user": "u"})])[0].allowed


def test_a_cost_that_can_never_fit_is_refused_in_its_place(build):
    limiter = build({"user": [token_bucket(3, 0)]})
    decisions = acquire_batch([(limiter, {"user": "u"}, 1), (limiter, {"user": "u"}, 4), (limiter, {"user": "u"}, 2)])
    assert [(d.allowed, d.reason) for d in decisions] == [(True, "OK"), (False, "COST_EXCEEDS_LIMIT"), (True, "OK")]
    assert decisions[1].retry_after == math.inf


def test_a_stateless_rule_that_denies_is_decided_in_its_turn(build, plugin_name):
    @register(plugin_name("blocklist"))
    class Blocklist(Rule):
        stateful = False
        params = (Param("keys", kind="strings", help="Keys that may never go."),)

        def wait_for_key(self, key, now, cost):
            return math.inf if key in self.keys else 0.0

    config = {"user": [{"type": Blocklist.type_name, "keys": ["bad"]}], "team": [token_bucket(2, 1)]}
    batched, one_by_one = build(config), build(config)
    items = [({"user": u, "team": "t"}, 1, None) for u in ("ok", "bad", "ok", "ok", "bad")]
    assert_same(acquire_batch([(batched, *item) for item in items]), [one_by_one.acquire(*item) for item in items])


def test_a_plug_in_without_lua_is_decided_in_its_turn(build, plugin_name):
    name = plugin_name("quota")
    register_lifetime_quota(name)
    quota = {"user": [{"type": name, "total": 3}], "team": [token_bucket(4, 0)]}
    plain = {"team": [token_bucket(4, 0)]}
    batched = build(quota)
    batched_plain = build(plain, store=batched.store)
    one_by_one = build(quota)
    one_by_one_plain = build(plain, store=one_by_one.store)
    items = [
        (0, {"user": "u", "team": "t"}),
        (1, {"team": "t"}),
        (0, {"user": "u", "team": "t"}),
        (1, {"team": "t"}),
        (0, {"user": "u", "team": "t"}),
    ]
    assert_same(
        acquire_batch([((batched, batched_plain)[i], keys) for i, keys in items]),
        [(one_by_one, one_by_one_plain)[i].acquire(keys) for i, keys in items],
    )
    assert state_of(batched, "team", "t")["tokens"] == 0


@pytest.mark.parametrize(
    "bad, field",
    [
        ((1, {"user": "u"}, -1), "1.cost"),
        ((1, {"user": "u"}, "2"), "1.cost"),
        ((1, {"user": "u"}, 1, "vip"), "1.priority"),
        ((1, {"user": ""}), "1.keys.user"),
        ((1, ["u"]), "1.keys"),
        (("not a limiter", {"user": "u"}), "1"),
        ((1,), "1"),
    ],
)
def test_a_bad_item_is_refused_by_its_index_before_anything_is_taken(build, bad, field):
    limiter = build({"user": [token_bucket(3, 0)]})
    bad = tuple(limiter if part == 1 else part for part in bad[:1]) + bad[1:]
    with pytest.raises(InvalidRequest) as error:
        acquire_batch([(limiter, {"user": "u"}), bad, (limiter, {"user": "u"})])
    assert error.value.field == field
    assert state_of(limiter, "user", "u")["tokens"] == 3


# --- Redis: one round trip, the Lua lost, outages -------------------------------------------


class CountingConnection(redis.Connection):
    """A connection that counts what it writes to the socket: one write per round trip."""

    writes = 0

    def send_packed_command(self, command, check_health=True):
        type(self).writes += 1
        return super().send_packed_command(command, check_health)


def counting_limiter(url, config, prefix, clock=None, **options):
    CountingConnection.writes = 0
    pool = redis.ConnectionPool.from_url(url, connection_class=CountingConnection)
    store = RedisStore(client=redis.Redis(connection_pool=pool), prefix=prefix)
    return HierarchicalLimiter.from_config(config, store=store, clock=clock, **options)


def test_a_batch_on_redis_is_one_round_trip_of_one_fcall_per_item(redis_url, redis_server):
    limiter = counting_limiter(redis_url, CONFIG, "trip", ManualClock(), priorities=PRIORITIES)
    # Loads the library and connects: the store keeps a connection for single decisions,
    # and a batch's pipeline takes another from the pool.
    limiter.acquire(KEY_SETS[0])
    acquire_batch([(limiter, KEY_SETS[0])])
    admin = redis_server.client()
    admin.config_resetstat()
    CountingConnection.writes = 0
    decisions = acquire_batch([(limiter, *item) for item in requests(random.Random(1), 30)])
    assert CountingConnection.writes == 1
    assert {d.allowed for d in decisions} == {True, False}
    assert any(d.lease for d in decisions)
    # A cost that can never fit is refused before the store is asked.
    asked = sum(d.reason != "COST_EXCEEDS_LIMIT" for d in decisions)
    assert 20 < asked < 30
    stats = admin.info("commandstats")
    assert stats["cmdstat_fcall"]["calls"] == asked
    assert not {"cmdstat_function|load", "cmdstat_evalsha", "cmdstat_multi"} & set(stats)


def test_losing_the_lua_between_batches_costs_no_error_and_counts_nothing_twice(losing_the_lua):
    url, flush = losing_the_lua
    config = {"user": [token_bucket(30, 0)], "team": [sliding_window(1000, 3600)]}
    limiter = counting_limiter(url, config, "flush", ManualClock())
    limiter.explain({"user": "u", "team": "t"})  # connects: the hand-shake is not counted below
    decisions = []
    for _ in range(5):
        flush()
        CountingConnection.writes = 0
        decisions += acquire_batch([(limiter, {"user": "u", "team": "t"})] * 10)
        # The pipeline, FUNCTION LOAD (or SCRIPT LOAD), and the pipeline again with the
        # commands that did not run.
        assert CountingConnection.writes == 3
    assert [d.allowed for d in decisions] == [True] * 30 + [False] * 20
    assert not any(d.degraded for d in decisions)
    assert state_of(limiter, "team", "t")["entries"] == 30


def test_losing_the_lua_during_batches_counts_every_admitted_request_once(losing_the_lua):
    url, flush = losing_the_lua
    config = {"user": [token_bucket(10_000, 0)], "team": [sliding_window(10_000, 3600)]}
    limiter = counting_limiter(url, config, "flushes", ManualClock())
    limiter.explain({"user": "u", "team": "t"})
    done = threading.Event()

    def flush_again_and_again():
        while not done.is_set():
            flush()
            done.wait(0.005)  # pacing the flushes, not aiming at an edge

    flusher = threading.Thread(target=flush_again_and_again)
    CountingConnection.writes = 0
    flusher.start()
    try:
        decisions = [d for _ in range(20) for d in acquire_batch([(limiter, {"user": "u", "team": "t"})] * 50)]
    finally:
        done.set()
        flusher.join()
    assert CountingConnection.writes > 20  # flushes did land: pipelines were sent again
    admitted = [d.allowed for d in decisions if not d.degraded]
    assert all(admitted) and len(admitted) > 500  # the rest met a flush at every try: fail open
    # Exactly one entry and one token per admitted request: nothing was counted twice.
    assert state_of(limiter, "team", "t")["entries"] == len(admitted)
    assert state_of(limiter, "user", "u")["tokens"] == 10_000 - len(admitted)


def test_an_item_redis_refuses_gets_its_fail_mode_and_the_others_still_count(redis_url, redis_server):
    limiter = HierarchicalLimiter.from_config(
        {"user": [token_bucket(5, 0)]},
        store=RedisStore(url=redis_url, prefix="wrong", timeout=1.0),
        clock=ManualClock(),
        fail_modes={"user": "closed"},
    )
    limiter.acquire({"user": "ok"})
    broken = limiter._plan({"user": "broken"}, None).store_plan.keys[0]
    redis_server.client().lpush(broken, "not a bucket")  # the script's GET fails: WRONGTYPE
    decisions = acquire_batch([(limiter, {"user": u}) for u in ("ok", "broken", "ok")])
    assert [(d.allowed, d.degraded) for d in decisions] == [(True, False), (False, True), (True, False)]
    assert decisions[1].reason == "STORE_UNAVAILABLE"
    assert state_of(limiter, "user", "ok")["tokens"] == 2


def test_while_redis_is_down_each_item_gets_its_levels_fail_modes(unreachable_redis_url):
    limiter = HierarchicalLimiter.from_config(
        {"user": [token_bucket(10, 1)], "team": [token_bucket(10, 1)], "global": [token_bucket(8, 0)]},
        store=RedisStore(url=unreachable_redis_url, prefix="down"),
        fail_modes={"user": "open", "team": "closed", "global": {"fail_mode": "local", "fallback_fraction": 0.25}},
    )
    decisions = acquire_batch(
        [
            (limiter, keys)
            for keys in ({"user": "u"}, {"user": "u", "team": "t"}, {"global": "*"}, {"global": "*"}, {"global": "*"})
        ]
    )
    assert all(d.degraded for d in decisions)
    assert [(d.allowed, d.reason) for d in decisions] == [
        (True, "OK"),
        (False, "STORE_UNAVAILABLE"),
        (True, "OK"),
        (True, "OK"),
        (False, "RATE_LIMITED"),
    ]


def test_a_batch_on_the_servers_clock_decides_at_redis_time(redis_url):
    limiter = HierarchicalLimiter.from_config(
        {"user": [fixed_window(3, 3600)]}, store=RedisStore(url=redis_url, prefix="time")
    )
    decisions = acquire_batch([(limiter, {"user": "u"})] * 4)
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert 0 < decisions[3].retry_after <= 3600


def test_one_batch_spans_stores_of_both_kinds_in_order(redis_url, clock):
    on_redis = HierarchicalLimiter.from_config(
        {"user": [token_bucket(2, 0)]}, store=RedisStore(url=redis_url, prefix="both"), clock=clock
    )
    in_memory = HierarchicalLimiter.from_config({"user": [token_bucket(1, 0)]}, clock=clock)
    move_to(clock, 5)
    decisions = acquire_batch([(on_redis, {"user": "u"}), (in_memory, {"user": "u"})] * 2)
    assert [d.allowed for d in decisions] == [True, True, True, False]


def test_a_batch_waits_longer_for_its_answers_than_a_single_decision(redis_url):
    # A batch of 1,000 is ~30 ms of Lua and may queue behind others: under the single call's
    # 50 ms read timeout a busy Redis would fail whole batches open.
    from core.stores.redis import BATCH_TIMEOUT, DEFAULT_TIMEOUT, RedisStore

    store = RedisStore(url=redis_url)
    try:
        single = store.client.connection_pool.connection_kwargs
        batch = store.batch_client.connection_pool.connection_kwargs
        assert single["socket_timeout"] == DEFAULT_TIMEOUT
        assert batch["socket_timeout"] == BATCH_TIMEOUT
        assert batch["socket_connect_timeout"] == DEFAULT_TIMEOUT  # a dead Redis is found as fast
    finally:
        store.close()
