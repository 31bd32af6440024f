"""The cluster store's own layout, on a real Redis Cluster of three primaries and three
replicas (tests/conftest.py starts it): every decision on one slot, teams spread over the
nodes, the global level split into sub-buckets that never admit more than the global limit.
The contract suite (every test that uses `build`) runs on the cluster too, on one shard."""

import collections

import pytest
from redis.cluster import RedisCluster, key_slot

from core import HierarchicalLimiter, ManualClock, StoreUnavailable, acquire_batch
from core.errors import ConfigError
from core.stores import store_from_url
from core.stores.cluster import ClusterStore

from .helpers import concurrency, token_bucket

# Three levels; the global one is split into 16 sub-buckets of 10 (rate 0: nothing refills).
CONFIG = {"user": [token_bucket(3, 0)], "team": [token_bucket(5, 0)], "global": [token_bucket(160, 0)]}


@pytest.fixture
def store(redis_cluster_url):
    store = store_from_url(redis_cluster_url, timeout=1.0, global_mode="split")
    yield store
    store.close()


def limiter_on(store, config=CONFIG, clock=None):
    return HierarchicalLimiter.from_config(config, store=store, clock=clock or ManualClock())


def slot_keys(store, keys):
    return store.prepare(limiter_on(store)._plan(keys, None).checks).keys


def script_calls(cluster) -> int:
    """Script calls (EVALSHA or FCALL) counted by every primary since the last reset."""
    calls = 0
    for node in cluster.primaries():
        client = node.client()
        stats = client.info("commandstats")
        client.close()
        calls += sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("evalsha", "fcall"))
    return calls


def test_the_url_makes_a_cluster_store_and_a_bad_one_says_what_is_wrong(redis_cluster_url):
    store = store_from_url(redis_cluster_url)
    assert isinstance(store, ClusterStore) and store.global_mode == "lease"  # the default
    store.close()
    with pytest.raises(ConfigError, match="not host:port"):
        store_from_url("redis-cluster://127.0.0.1:6379,nowhere")
    with pytest.raises(ConfigError, match="shards"):
        ClusterStore(url=redis_cluster_url, shards=0)


def test_every_key_of_a_decision_shares_the_slot_of_its_team(store):
    keys = slot_keys(store, {"user": "u1", "team": "acme", "global": "*"})
    assert len({key_slot(key.encode()) for key in keys}) == 1
    # A user's key is under its team's shard, whichever user it is, and names the team.
    other = slot_keys(store, {"user": "someone-else", "team": "acme", "global": "*"})
    assert key_slot(other[0].encode()) == key_slot(keys[0].encode())
    assert other[1:] == keys[1:]
    assert ":user:u1@acme:" in keys[0]


def test_teams_spread_over_every_primary(store, redis_cluster_servers):
    limiter = limiter_on(store)
    for team in range(100):
        assert limiter.acquire({"user": "u", "team": f"team-{team}", "global": "*"}).allowed
    holding = []
    for node in redis_cluster_servers.primaries():
        client = node.client()
        holding.append(client.dbsize())
        client.close()
    assert len(holding) == 3 and all(count > 0 for count in holding), holding
    # A team key and its user's key per team, and the 16 sub-buckets of the global level.
    assert sum(holding) == 100 * 2 + store.shards


def test_one_decision_is_one_script_call_on_one_node(store, redis_cluster_servers):
    limiter = limiter_on(store)
    limiter.acquire({"user": "u", "team": "warm-up", "global": "*"})  # loads the script
    for node in redis_cluster_servers.primaries():
        client = node.client()
        client.config_resetstat()
        client.close()
    decisions = [limiter.acquire({"user": f"u{i % 4}", "team": f"t{i % 7}", "global": "*"}) for i in range(40)]
    assert {d.allowed for d in decisions} == {True, False}
    assert script_calls(redis_cluster_servers) == 40


def test_the_split_global_level_never_admits_more_than_its_limit_and_fills_when_spread(store):
    limiter = limiter_on(store, {"team": [token_bucket(1000, 0)], "global": [token_bucket(160, 0)]})
    admitted = collections.Counter()
    for _round in range(40):
        for team in range(100):
            admitted[team] += limiter.acquire({"team": f"team-{team}", "global": "*"}).allowed
    # Each of the 16 sub-buckets holds 10; 100 teams all flooding fill every one of them.
    assert sum(admitted.values()) == 160
    assert limiter.inspect("global", "*")[0]["state"]["tokens"] == 0
    assert limiter.inspect("global", "*")[0]["state"]["capacity"] == 160


def test_a_skewed_shard_denies_while_others_have_room(store):
    limiter = limiter_on(store, {"team": [token_bucket(1000, 0)], "global": [token_bucket(160, 0)]})
    decisions = [limiter.acquire({"team": "one-busy-team", "global": "*"}) for _ in range(20)]
    # One team is on one shard: it gets that shard's 10, and the other 150 stay unused.
    assert sum(d.allowed for d in decisions) == 10
    assert decisions[-1].blocked_by.startswith("global")
    assert limiter.inspect("global", "*")[0]["state"]["tokens"] == 150


def test_decisions_with_only_the_global_level_take_the_shards_in_turn(store):
    limiter = limiter_on(store, {"global": [token_bucket(160, 0)]})
    admitted = sum(limiter.acquire({"global": "*"}).allowed for _ in range(200))
    assert admitted == 160


def test_per_team_and_per_user_limits_stay_exact(store):
    limiter = limiter_on(store)
    admitted = collections.Counter()
    for i in range(300):
        keys = {"user": f"u{i % 6}", "team": f"t{i % 3}", "global": "*"}
        admitted[keys["team"], keys["user"]] += limiter.acquire(keys).allowed
    per_team = collections.Counter()
    for (team, _), count in admitted.items():
        per_team[team] += count
        assert count <= 3
    assert all(per_team[f"t{t}"] == 5 for t in range(3)), per_team
    # A denial at the team level took nothing from the user: each user's bucket shows only
    # what was admitted.
    for (team, user), count in admitted.items():
        plan = limiter._plan({"user": user, "team": team, "global": "*"}, None)
        assert store.inspect(plan.store_plan, 0.0)[0]["tokens"] == 3 - count


def test_a_batch_on_the_cluster_decides_as_one_after_the_other(store, redis_cluster_url):
    limiter = limiter_on(store)
    items = [(limiter, {"user": f"u{i % 5}", "team": f"t{i % 9}", "global": "*"}, 1, None) for i in range(120)]
    batched = acquire_batch(items)
    alone = store_from_url(redis_cluster_url, timeout=1.0, prefix="alone", global_mode="split")
    one_by_one = limiter_on(alone)
    expected = [one_by_one.acquire(keys) for _, keys, _, _ in items]
    alone.close()
    assert [(d.allowed, d.blocked_by) for d in batched] == [(d.allowed, d.blocked_by) for d in expected]
    assert {d.allowed for d in batched} == {True, False}


def test_a_reservation_lives_on_its_shard_and_settles(store):
    limiter = limiter_on(store, {"team": [token_bucket(10, 0), concurrency(2)], "global": [token_bucket(160, 0)]})
    decision, reservation = limiter.reserve({"team": "acme", "global": "*"}, cost=4)
    assert decision.allowed
    shard = int(reservation.id.rsplit(".", 1)[1])
    assert shard == store.shard_of("acme")
    assert store.reservation(reservation.id, now=0.0)["status"] == "open"
    settlement = limiter.settle(reservation.id, actual_cost=1)
    assert settlement.refunded == 3 and settlement.released == 1
    assert limiter.inspect("team", "acme")[0]["state"]["tokens"] == 9
    # A global-only reservation picks a shard in turn, and its id says which.
    _, global_only = limiter.reserve({"global": "*"}, cost=2)
    assert limiter.settle(global_only.id).refunded == 2
    assert limiter.inspect("global", "*")[0]["state"]["tokens"] == 159
    assert store.reservation("no-dot-here", now=0.0) is None
    assert store.reservation("abc.99", now=0.0) is None


def test_a_reset_of_a_split_level_empties_every_sub_bucket(store):
    limiter = limiter_on(store, {"global": [token_bucket(160, 0)]})
    for _ in range(50):
        limiter.acquire({"global": "*"})
    assert limiter.inspect("global", "*")[0]["state"]["tokens"] == 110
    limiter.reset("global", "*")
    assert limiter.inspect("global", "*")[0]["state"]["tokens"] == 160


# --- the leased global budget ----------------------------------------------------------------


class Ticks:
    """The lease interval's clock, moved by hand."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def leasing(redis_cluster_url):
    made = []

    def make(fraction=0.1, prefix="la"):
        ticks = Ticks()
        store = ClusterStore(
            url=redis_cluster_url,
            timeout=1.0,
            global_mode="lease",
            lease_fraction=fraction,
            lease_interval=1.0,
            lease_clock=ticks,
            prefix=prefix,
        )
        made.append(store)
        return store, ticks

    yield make
    for store in made:
        store.close()


def test_the_global_mode_must_be_known(redis_cluster_url):
    with pytest.raises(ConfigError, match="split, lease"):
        ClusterStore(url=redis_cluster_url, global_mode="sometimes")
    with pytest.raises(ConfigError, match="lease_fraction"):
        ClusterStore(url=redis_cluster_url, global_mode="lease", lease_fraction=0)


def test_leased_slices_never_admit_more_than_the_global_limit_across_processes(leasing):
    config = {"team": [token_bucket(1000, 0)], "global": [token_bucket(100, 0)]}
    # Three stores stand for three processes, each leasing slices of 10 from one pool.
    stores = [leasing()[0] for _ in range(3)]
    limiters = [limiter_on(store, config) for store in stores]
    admitted = sum(limiters[i % 3].acquire({"team": f"t{i % 40}", "global": "*"}).allowed for i in range(400))
    assert admitted == 100
    assert limiters[0].inspect("global", "*")[0]["state"]["tokens"] == 0


def test_a_slice_decides_locally_until_it_runs_out(leasing, redis_cluster_servers):
    store, _ = leasing(fraction=0.1)
    limiter = limiter_on(store, {"global": [token_bucket(100, 0)]})
    limiter.acquire({"global": "*"})  # the first slice: 10, one of them spent
    for node in redis_cluster_servers.primaries():
        client = node.client()
        client.config_resetstat()
        client.close()
    assert all(limiter.acquire({"global": "*"}).allowed for _ in range(9))
    assert script_calls(redis_cluster_servers) == 0  # all from the slice in hand
    assert limiter.acquire({"global": "*"}).allowed  # a new slice
    assert script_calls(redis_cluster_servers) == 1


def test_a_denial_at_another_level_gives_the_slice_back(leasing):
    store, _ = leasing(fraction=0.1)
    limiter = limiter_on(store, {"team": [token_bucket(2, 0)], "global": [token_bucket(100, 0)]})
    decisions = [limiter.acquire({"team": "acme", "global": "*"}) for _ in range(5)]
    assert [d.allowed for d in decisions] == [True, True, False, False, False]
    assert all(d.blocked_by.startswith("team") for d in decisions[2:])
    budget = next(iter(store.shared_budgets.shares.values()))
    assert budget.allowance == 8  # a slice of 10, two taken, three denials gave theirs back


def test_what_a_slice_left_goes_back_to_the_pool_after_the_interval(leasing):
    first, ticks = leasing(fraction=0.5)
    second, _ = leasing(fraction=0.5)
    config = {"global": [token_bucket(10, 0)]}
    one, two = limiter_on(first, config), limiter_on(second, config)
    assert one.acquire({"global": "*"}).allowed  # leases 5 of 10, keeps 4
    assert sum(two.acquire({"global": "*"}).allowed for _ in range(10)) == 5  # the other 5
    denied = two.acquire({"global": "*"})
    assert not denied.allowed and denied.retry_after == 1.0  # slices come back within 1 s
    ticks.now = 1.5  # the first store's slice has expired: its next call gives back 4
    assert one.acquire({"global": "*"}).allowed
    assert sum(two.acquire({"global": "*"}).allowed for _ in range(10)) == 0  # one holds them
    assert one.inspect("global", "*")[0]["state"]["tokens"] == 3


def test_a_leased_reservation_settles_into_the_slice(leasing):
    store, _ = leasing(fraction=0.1)
    limiter = limiter_on(store, {"team": [token_bucket(100, 0)], "global": [token_bucket(100, 0)]})
    decision, reservation = limiter.reserve({"team": "acme", "global": "*"}, cost=8)
    assert decision.allowed
    budget = next(iter(store.shared_budgets.shares.values()))
    assert budget.allowance == 2
    settlement = limiter.settle(reservation.id, actual_cost=3)
    assert settlement.refunded == 5 and budget.allowance == 7
    _, global_only = limiter.reserve({"global": "*"}, cost=7)
    assert global_only is not None and budget.allowance == 0
    limiter.settle(global_only.id)  # cancelled: all 7 back
    assert budget.allowance == 7


def test_a_dead_pool_applies_the_fail_mode_and_gives_nothing_away(leasing, redis_cluster_servers):
    store, _ = leasing(fraction=0.1)
    limiter = HierarchicalLimiter.from_config(
        {"global": [token_bucket(100, 0)]}, store=store, clock=ManualClock(), fail_modes={"global": "closed"}
    )
    assert limiter.acquire({"global": "*"}).allowed
    budget = next(iter(store.shared_budgets.shares.values()))
    store.store_of(budget.key).breaker.open_until = float("inf")  # as if the pool's node had failed three times
    budget.allowance = 0.0
    denied = limiter.acquire({"global": "*"})
    assert denied.degraded and not denied.allowed and denied.reason == "STORE_UNAVAILABLE"


def test_a_leased_dry_run_and_inspection_show_the_pool_and_the_slice(leasing):
    store, _ = leasing(fraction=0.1)
    limiter = limiter_on(store, {"team": [token_bucket(5, 0)], "global": [token_bucket(100, 0)]})
    assert limiter.acquire({"team": "acme", "global": "*"}, cost=3).allowed  # a slice of 10, 7 left
    decision, rows = limiter.explain({"team": "acme", "global": "*"}, cost=3)
    assert not decision.allowed and decision.blocked_by.startswith("team")  # 2 left there
    by_level = {row["level"]: row for row in rows}
    assert by_level["global"]["remaining"] == 97  # the pool's 90 and this process's 7
    assert by_level["team"]["remaining"] == 2
    state = limiter.inspect("global", "*")[0]["state"]
    assert (state["tokens"], state["capacity"], state["leased"]) == (97, 100, True)
    assert limiter.inspect("team", "acme")[0]["state"]["tokens"] == 2
    limiter.reset("global", "*")
    assert limiter.inspect("global", "*")[0]["state"]["tokens"] == 100


def test_a_batch_after_the_library_was_flushed_everywhere_loads_it_and_counts_once(store, redis_cluster_servers):
    limiter = limiter_on(store)
    assert limiter.acquire({"user": "u", "team": "t0", "global": "*"}).allowed  # loaded where needed
    for node in redis_cluster_servers.primaries():
        client = node.client()
        client.execute_command("FUNCTION", "FLUSH")
        client.close()
    batch = acquire_batch(
        [(limiter, {"user": f"u{i}", "team": f"t{i % 7}", "global": "*"}, 1, None) for i in range(40)]
    )
    assert not any(d.degraded for d in batch)
    per_team = collections.Counter(f"t{i % 7}" for i, d in enumerate(batch) if d.allowed)
    # Team limit 5: t0 had one before the flush; nothing counted twice.
    assert per_team["t0"] == 4 and all(per_team[f"t{t}"] == 5 for t in range(1, 7))


# --- one store per node: every call through its node's breaker -------------------------------


def test_every_call_on_a_shard_goes_through_the_breaker_of_its_node(store):
    limiter = limiter_on(store)
    acme = {"user": "u", "team": "acme", "global": "*"}
    node = store.node_of(slot_keys(store, acme)[0])
    other_team = next(f"t{i}" for i in range(100) if store.node_of(slot_keys(store, {"team": f"t{i}"})[0]) != node)
    elsewhere = {"user": "u", "team": other_team, "global": "*"}
    assert limiter.acquire(acme).allowed and limiter.acquire(elsewhere).allowed
    # Three failed calls on acme's node, on a clock that then stands still: its breaker is open.
    breaker = store.store_of(slot_keys(store, acme)[0]).breaker
    breaker.clock = ManualClock(100.0)
    for _ in range(3):
        breaker.failed()
    assert limiter.acquire(acme).degraded
    assert limiter.reserve(acme)[0].degraded
    for call in (
        lambda: limiter.explain(acme),
        lambda: limiter.inspect("team", "acme"),
        lambda: limiter.reset("team", "acme"),
    ):
        with pytest.raises(StoreUnavailable, match="unreachable"):
            call()
    with pytest.raises(StoreUnavailable, match=node):
        store.ping()
    # The other nodes go on, and the cluster's time comes from one that answers.
    assert not limiter.acquire(elsewhere).degraded
    assert limiter.inspect("team", other_team)[0]["state"]["tokens"] == 3
    assert store.time() > 0
    health = {part["name"]: part for part in store.health()}
    assert len(health) == 3
    assert health[f"Redis Cluster node {node}"]["state"] == "down"
    assert health[f"Redis Cluster node {node}"]["failures"] == 3
    assert [part["state"] for name, part in health.items() if not name.endswith(node)] == ["up", "up"]


def test_the_slot_map_read_from_the_cluster_sends_each_key_to_the_primary_that_holds_it(store, redis_cluster_servers):
    keys = slot_keys(store, {"user": "u", "team": "acme", "global": "*"})
    probe = RedisCluster(host="127.0.0.1", port=redis_cluster_servers.primaries()[0].port)
    owner = probe.get_node_from_key(keys[0])
    probe.close()
    assert store.node_of(keys[0]) == f"{owner.host}:{owner.port}"
    assert len(store.router.slots.primaries()) == 3


def test_failures_faster_than_the_refresh_interval_still_read_the_slots_again_every_interval(redis_cluster_url):
    """Failures come faster than REFRESH_EVERY while a primary is down: each may skip a read,
    but none may put the next one off, or the slots are never read again and the shards of a
    primary that failed over stay down."""
    from core.stores.cluster import REFRESH_EVERY, SlotMap, parse_cluster_url

    clock = ManualClock(100.0)

    class Counted(SlotMap):
        reads = 0

        def _read(self, node):
            Counted.reads += 1
            return super()._read(node)

    slots = Counted(parse_cluster_url(redis_cluster_url), 1.0, clock)
    assert slots.refresh() is True and Counted.reads == 1
    read_at = clock.now
    for _ in range(5):  # a failure every fifth of the interval
        clock.now += REFRESH_EVERY / 5
        if clock.now - read_at < REFRESH_EVERY:
            assert slots.refresh(failed="127.0.0.1:1") is False
    clock.now = read_at + REFRESH_EVERY * 1.2
    assert slots.refresh(failed="127.0.0.1:1") is True
    assert Counted.reads == 2
    assert len(slots.primaries()) == 3
