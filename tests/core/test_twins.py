"""A rule's Redis twin is declared beside the rule (core/twins.py): a plug-in rule that brings
one class and one Lua file runs on memory, on Redis and on a cluster alike, its Lua in the
store's library, with no edit anywhere else.

LeakyBucket is that plug-in: this module and leaky_bucket.lua next to it are all of it.
"""

import math
from pathlib import Path

import pytest

from core import HierarchicalLimiter, ManualClock, Param, Rule, register
from core.buckets import TokenBucket
from core.rules import EPSILON
from core.stores.library import current_library
from core.stores.redis import RedisStore
from core.twins import RedisTwin

from .helpers import register_lifetime_quota, token_bucket

LEAKY_TWIN = RedisTwin(
    Path(__file__).parent / "leaky_bucket.lua",
    ("capacity", "rate"),
    encode=lambda rule, state: f"{state[2]!r} {state[3]!r}",
    decode=lambda rule, raw: (0.0, 0.0, *map(float, raw.split())),
)


class LeakyBucket(Rule):
    """Each request pours its cost in, and `rate` leaks out every second; a request fits
    while the level stays within `capacity`. State: (idle_at, room, level, at)."""

    params = (
        Param("capacity", help="The most the bucket holds.", minimum=0, exclusive_minimum=True),
        Param("rate", help="What leaks out each second.", minimum=0, exclusive_minimum=True),
    )
    redis_twin = LEAKY_TWIN
    rate: float

    def setup(self):
        self.capacity = float(self.capacity)
        self.rate = float(self.rate)

    def _level(self, state, now):
        if state is None:
            return 0.0
        level = state[2] - (now - state[3]) * self.rate
        return level if level > 0 else 0.0

    def wait(self, state, now, cost, floor):
        over = self._level(state, now) + cost + floor - self.capacity
        if over <= EPSILON:
            return 0.0
        if cost + floor > self.capacity:
            return math.inf
        return over / self.rate

    def take(self, state, now, cost, lease):
        level = self._level(state, now) + cost
        return now + level / self.rate, self.capacity - level, level, now

    def remaining(self, state, now):
        return max(0.0, self.capacity - self._level(state, now))


@pytest.fixture
def leaky(plugin_name):
    """A rule type of the test's own name: a subclass of LeakyBucket that declares the twin
    (a twin is never inherited)."""
    name = plugin_name("leaky_bucket")
    register(name)(type(f"LeakyBucket_{name}", (LeakyBucket,), {"redis_twin": LEAKY_TWIN}))
    return lambda capacity, rate, **extra: {"type": name, "capacity": capacity, "rate": rate, **extra}


@pytest.fixture(params=["redis", "cluster"])
def remote(request):
    """(a fresh store on Redis or on the cluster, the redis-servers it decides on)."""
    from core.stores.cluster import ClusterStore

    if request.param == "redis":
        store = RedisStore(url=request.getfixturevalue("redis_url"), timeout=1.0)
        servers = [request.getfixturevalue("redis_server")]
    else:
        url = request.getfixturevalue("redis_cluster_url")
        store = ClusterStore(url=url, timeout=1.0, shards=1, global_mode="split")
        servers = request.getfixturevalue("redis_cluster_servers").primaries()
    yield store, servers
    store.close()


def commands_run(servers):
    """Calls per command over `servers` since their statistics were reset."""
    counts = {}
    for server in servers:
        client = server.client()
        for name, stats in client.info("commandstats").items():
            counts[name.removeprefix("cmdstat_")] = counts.get(name.removeprefix("cmdstat_"), 0) + stats["calls"]
        client.close()
    return counts


def test_a_plug_in_with_a_lua_twin_decides_alike_on_every_store(build, clock, leaky):
    limiter = build({"user": [leaky(3, 1)], "team": [token_bucket(100, 0)]})
    keys = {"user": "u", "team": "t"}
    assert [limiter.acquire(keys).allowed for _ in range(3)] == [True, True, True]
    denied = limiter.acquire(keys)
    assert (denied.allowed, denied.retry_after, denied.blocked_by) == (
        False,
        1.0,
        f"user: {limiter.levels['user'][0].display()}",
    )
    clock.advance(1.5)  # 1.5 leaked out: 1.5 in the bucket
    assert limiter.acquire(keys, cost=1.5).allowed
    assert limiter.acquire(keys, cost=0.5).retry_after == pytest.approx(0.5)
    assert limiter.inspect("user", "u")[0]["state"] == {"remaining": 0.0}
    decision, rows = limiter.explain(keys, cost=4)
    assert decision.retry_after == math.inf and rows[0]["remaining"] == 0.0
    assert limiter.inspect("team", "t")[0]["state"]["tokens"] == 100 - 3 - 1.5


def test_on_redis_and_the_cluster_each_decision_is_one_call_of_the_twin(remote, leaky):
    store, servers = remote
    limiter = HierarchicalLimiter.from_config({"user": [leaky(10, 1)], "team": [leaky(5, 0.5)]}, store=store)
    limiter.acquire({"user": "warm-up", "team": "warm-up"})  # loads the library where it goes
    for server in servers:
        server.client().config_resetstat()
    decisions = [limiter.acquire({"user": f"u{i % 2}", "team": "t"}) for i in range(8)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False] * 3
    counts = commands_run(servers)
    # One FCALL per decision; no WATCH or MULTI, which the optimistic path would send.
    assert counts.get("fcall") == 8
    assert not {"watch", "multi", "exec"} & set(counts)


def test_the_library_holds_the_lua_of_every_registered_twin(plugin_name):
    before = current_library()
    assert "leaky_bucket" not in before.twins
    register(plugin_name("leaky_bucket"))(type("Leaky", (LeakyBucket,), {"redis_twin": LEAKY_TWIN}))
    after = current_library()
    assert after.twins == before.twins | {"leaky_bucket"}
    assert "RULES['leaky_bucket'] = leaky" in after.source
    assert after.name != before.name and after.function != before.function  # its hash moved


def test_a_store_made_before_the_rule_registered_loads_the_new_library_beside_the_old(
    redis_url, redis_server, plugin_name
):
    store = RedisStore(url=redis_url, timeout=1.0)
    older = HierarchicalLimiter.from_config({"user": [token_bucket(5, 0)]}, store=store, clock=ManualClock())
    assert older.acquire({"user": "u"}).allowed  # the server holds the library without the plug-in
    old_library = store.library
    name = plugin_name("leaky_bucket")
    register(name)(type("Leaky", (LeakyBucket,), {"redis_twin": LEAKY_TWIN}))
    newer = HierarchicalLimiter.from_config(
        {"user": [{"type": name, "capacity": 2, "rate": 1}]}, store=store, clock=ManualClock()
    )
    assert [newer.acquire({"user": "u"}).allowed for _ in range(3)] == [True, True, False]
    assert store.library != old_library
    libraries = {dict(zip(e[::2], e[1::2]))[b"library_name"].decode() for e in redis_server.client().function_list()}
    assert {old_library, store.library} <= libraries
    assert older.acquire({"user": "u"}).allowed  # the built-in rules go on, in the new library
    store.close()


def test_beside_a_plug_in_without_a_twin_its_state_is_kept_as_its_twin_encodes_it(redis_url, leaky, plugin_name):
    # The optimistic path writes the leaky bucket's state from Python; its Lua then reads it.
    quota = plugin_name("quota")
    register_lifetime_quota(quota)
    clock = ManualClock(1000.0)
    store = RedisStore(url=redis_url, timeout=1.0)
    both = HierarchicalLimiter.from_config(
        {"user": [{"type": quota, "total": 100}, leaky(3, 1)]}, store=store, clock=clock
    )
    alone = HierarchicalLimiter.from_config({"user": [leaky(3, 1)]}, store=store, clock=clock)
    assert [both.acquire({"user": "u"}).allowed for _ in range(2)] == [True, True]  # optimistic
    assert [alone.acquire({"user": "u"}).allowed for _ in range(2)] == [True, False]  # its Lua
    clock.advance(0.25)
    assert alone.acquire({"user": "u"}).retry_after == pytest.approx(0.75)
    assert both.inspect("user", "u")[1]["state"]["remaining"] == pytest.approx(0.25)
    store.close()


def test_a_subclass_does_not_inherit_its_parents_twin(plugin_name, redis_url):
    name = plugin_name("token_bucket")
    cls = register(name)(type("Changed", (TokenBucket,), {}))
    assert TokenBucket.redis_twin is not None and cls.redis_twin is None
    store = RedisStore(url=redis_url)
    limiter = HierarchicalLimiter.from_config({"user": [{"type": name, "capacity": 1, "per_second": 0}]}, store=store)
    assert limiter._plan({"user": "u"}, None).store_plan.optimistic  # decided in Python, not by its parent's Lua
    assert [limiter.acquire({"user": "u"}).allowed for _ in range(2)] == [True, False]
    store.close()


def test_a_twin_says_how_its_state_is_kept():
    with pytest.raises(ValueError, match="redis_type"):
        RedisTwin(Path("x.lua"), ("capacity",), str, str, redis_type="hash")
    with pytest.raises(ValueError, match="at least one"):
        RedisTwin(Path("x.lua"), (), str, str)
