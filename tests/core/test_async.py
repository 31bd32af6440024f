"""The limiter for coroutines: `aacquire` and `arelease` make the decisions `acquire` and
`release` make, on every store (in process, Redis on redis-py's asyncio client, a cluster),
without blocking the event loop while Redis is slow, and with the same fail modes when it is
gone.

The twin test replays one random sequence on two limiters with one manual clock, one
deciding with `acquire` and one with `aacquire`, each on a store of its own: the only
difference between them is the path.
"""

import asyncio
import itertools
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core import RULES, HierarchicalLimiter, ManualClock, MemoryStore
from core.stores.redis import RedisStore

from .helpers import concurrency, fixed_window, gcra, quota, register_lifetime_quota, sliding_window, token_bucket

CONFIG = {
    "user": [token_bucket(3, 1, label="USER_BURST"), sliding_window(3, 10, counts="requests")],
    "team": [gcra(1, 2.5), fixed_window(3, 5), concurrency(2, lease=7)],
    "global": [token_bucket(8, 0), token_bucket(2, 0.5, shadow=True)],
}
PRIORITIES = {"batch": {"watermark": 0.25, "levels": ["team", "global"]}}
# A soft quota that demotes: aacquire reads the store before it decides (call_async).
DEMOTING = {
    "user": [token_bucket(3, 1), quota(2, "hour", mode="soft", demote_to="batch")],
    "team": [fixed_window(3, 5)],
}

keys_strategy = st.fixed_dictionaries(
    {}, optional={"user": st.sampled_from(("ann", "bob")), "team": st.sampled_from(("red", "blue"))}
).filter(bool)
steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("acquire"), keys_strategy, st.sampled_from([1, 2, 0.5, 3, 9]), st.sampled_from([None, "batch"])
        ),
        st.tuples(st.just("advance"), st.sampled_from([0.1, 0.5, 1.0, 2.5, 5.0])),
        st.tuples(st.just("release"), st.integers(0, 5)),
    ),
    min_size=5,
    max_size=30,
)
_prefixes = itertools.count(1)


@pytest.fixture
def loop():
    """One event loop for the whole test, as a server has: its asyncio connections live on it."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def twins(new_store, clock, config, priorities=PRIORITIES):
    make = [
        HierarchicalLimiter.from_config(config, store=new_store(), clock=clock, priorities=priorities) for _ in "ab"
    ]
    return make[0], make[1]


def replay(loop, clock, sync, coro, ops):
    """Every step on both limiters; the decisions must be equal, step by step."""
    held = []
    for op in ops:
        if op[0] == "acquire":
            _, keys, cost, priority = op
            keys = {**keys, "global": "*"} if "global" in sync.levels else keys
            one = sync.acquire(keys, cost, priority)
            other = loop.run_until_complete(coro.aacquire(keys, cost, priority))
            assert other == one, (op, one, other)
            assert (one.lease is None) == (other.lease is None)
            if one.lease:
                held.append((keys, one.lease, other.lease))
        elif op[0] == "advance":
            clock.advance(op[1])
        elif held:
            keys, lease, other_lease = held.pop(op[1] % len(held))
            assert loop.run_until_complete(coro.arelease(keys, other_lease)) == sync.release(keys, lease)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=steps)
@example(ops=[("acquire", {"team": "red"}, 1, None)] * 4 + [("release", 0)] + [("acquire", {"team": "red"}, 1, None)])
def test_aacquire_decides_as_acquire_for_any_sequence(new_store, loop, ops):
    clock = ManualClock(1000.0)
    sync, coro = twins(new_store, clock, CONFIG)
    replay(loop, clock, sync, coro, ops)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=steps)
def test_aacquire_demotes_past_a_soft_quota_as_acquire_does(new_store, loop, ops):
    clock = ManualClock(1_780_000_000.0)  # a calendar time: the quota's hour is a real one
    sync, coro = twins(new_store, clock, DEMOTING, {"batch": {"watermark": 0.5, "levels": ["user", "team"]}})
    replay(loop, clock, sync, coro, [op for op in ops if op[0] != "release"])


def test_a_plug_in_rule_without_a_twin_is_decided_alike_in_a_thread(new_store, loop):
    name = f"async_lifetime_quota_{next(_prefixes)}"
    register_lifetime_quota(name)
    try:
        clock = ManualClock(1000.0)
        config = {"user": [{"type": name, "total": 3}, token_bucket(5, 1)]}
        sync, coro = twins(new_store, clock, config, None)
        answers = [
            (sync.acquire({"user": "u"}).allowed, loop.run_until_complete(coro.aacquire({"user": "u"})).allowed)
            for _ in range(4)
        ]
        assert answers == [(True, True)] * 3 + [(False, False)]
    finally:
        RULES.pop(name, None)


def test_a_bad_request_is_refused_by_aacquire_as_by_acquire(loop):
    limiter = HierarchicalLimiter.from_config(CONFIG, store=MemoryStore())
    for keys, cost, field in (({"usr": "u"}, 1, "keys.usr"), ({"user": "u"}, -1, "cost"), ({"user": "u"}, "1", "cost")):
        with pytest.raises(Exception) as sync_error:
            limiter.acquire(keys, cost)
        with pytest.raises(type(sync_error.value)) as async_error:
            loop.run_until_complete(limiter.aacquire(keys, cost))
        assert str(async_error.value) == str(sync_error.value)
        assert getattr(async_error.value, "field", None) == field


# --- Redis: the event loop goes on; a dead Redis gets the fail modes ----------------------------


def test_while_redis_is_slow_the_event_loop_keeps_serving(redis_url, redis_server, loop):
    """CLIENT PAUSE on another connection holds every client's commands for 0.6 s: an
    awaited decision waits for Redis, and meanwhile other coroutines run on the loop every
    few milliseconds."""
    store = RedisStore(url=redis_url, prefix=f"slow{next(_prefixes)}", timeout=2.0)
    limiter = HierarchicalLimiter.from_config({"user": [token_bucket(10, 1)]}, store=store)
    loop.run_until_complete(limiter.aacquire({"user": "u"}))  # connected, library loaded

    async def tick(ticks, until):
        while time.monotonic() < until:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.005)

    async def scene():
        pauser = redis_server.client(socket_timeout=5)
        pauser.execute_command("CLIENT", "PAUSE", "500", "ALL")
        ticks = []
        started = time.monotonic()
        ticker = asyncio.ensure_future(tick(ticks, started + 0.4))
        decision = await limiter.aacquire({"user": "u"})
        waited = time.monotonic() - started
        await ticker
        pauser.close()
        return decision, waited, ticks, started

    decision, waited, ticks, started = loop.run_until_complete(scene())
    assert decision.allowed and not decision.degraded
    assert waited >= 0.3, "the decision waited for Redis"
    gaps = [later - earlier for earlier, later in zip([started, *ticks], ticks)]
    assert len(ticks) >= 20 and max(gaps) < 0.1, "the loop stalled while the decision waited"
    store.close()


@pytest.mark.parametrize(
    "fail_mode, allowed", [("open", True), ("closed", False), ({"fail_mode": "local", "fallback_fraction": 0.5}, True)]
)
def test_with_redis_gone_aacquire_applies_the_fail_mode_within_the_timeout(
    unreachable_redis_url, loop, fail_mode, allowed
):
    store = RedisStore(url=unreachable_redis_url, timeout=0.05)
    limiter = HierarchicalLimiter.from_config(
        {"team": [token_bucket(4, 1)]}, store=store, fail_modes={"team": fail_mode}
    )
    started = time.monotonic()
    decisions = [loop.run_until_complete(limiter.aacquire({"team": "acme"})) for _ in range(5)]
    elapsed = time.monotonic() - started
    assert all(d.degraded for d in decisions)
    assert [d.allowed for d in decisions][0] is allowed
    if fail_mode == "closed":
        assert decisions[0].reason == "STORE_UNAVAILABLE"
    assert elapsed < 1.0, f"5 decisions on a dead Redis took {elapsed:.2f} s"
    assert store.breaker.failures >= 3  # the same breaker as the sync path's


def test_the_asyncio_clients_are_the_loops_and_go_with_them(redis_url):
    store = RedisStore(url=redis_url, prefix=f"loops{next(_prefixes)}", timeout=1.0)
    limiter = HierarchicalLimiter.from_config({"user": [token_bucket(10, 0)]}, store=store)
    for _ in range(3):
        assert asyncio.run(limiter.aacquire({"user": "u"})).allowed
    assert len(store._async_clients) == 1  # the closed loops' clients were dropped
    assert limiter.acquire({"user": "u"}).remaining == 6  # one bucket for both paths
    store.close()
