"""Redis Cluster under load: floods from 4 processes on a real 3-primary cluster, and a
primary killed (SIGKILL) while gunicorn serves decisions on REDIS_URL=redis-cluster://...

The floods: the global level, split into 16 sub-buckets, never admits more than its limit,
and admits at least 90 % of it when the traffic is spread over 100 teams; each team's own
limit stays exact. The kill: no request fails; the decisions whose shard lived on the dead
primary get their levels' fail modes, the others go on on Redis; once a replica has taken
over, every decision is back on Redis.
"""

import collections

import pytest
from redis.cluster import RedisCluster, key_slot

from .conftest import sleep_until, warm
from .deciders import decide_spread
from .load import Load, describe, percentile

pytestmark = pytest.mark.slow

PROCESSES, THREADS, EACH = 4, 50, 25  # 5,000 decisions
TEAMS = [{"user": f"user-{n}", "team": f"team-{n % 100}", "global": "*"} for n in range(1000)]
UNLIMITED = {"type": "token_bucket", "capacity": 1_000_000, "per_second": 0}


@pytest.mark.parametrize("mode", ["split", "lease"])
def test_a_flood_over_100_teams_admits_at_most_the_global_limit_and_at_least_90_percent(redis_cluster_url, mode):
    config = {
        "user": [UNLIMITED],
        "team": [UNLIMITED],
        "global": [{"type": "token_bucket", "capacity": 1000, "per_second": 0}],
    }
    answers = decide_spread(
        redis_cluster_url, config, TEAMS, PROCESSES, THREADS, each=EACH, options={"global_mode": mode}
    )
    assert len(answers) == PROCESSES * THREADS * EACH
    assert not any(degraded for _, degraded, _ in answers)
    admitted = sum(allowed for allowed, _, _ in answers)
    print(f"\n{mode}: {len(answers)} decisions over 100 teams: {admitted} admitted of a global 1,000")
    assert 900 <= admitted <= 1000


def test_a_flood_keeps_every_team_limit_exact(redis_cluster_url):
    config = {
        "user": [UNLIMITED],
        "team": [{"type": "token_bucket", "capacity": 7, "per_second": 0}],
        "global": [UNLIMITED],
    }
    answers = decide_spread(redis_cluster_url, config, TEAMS, PROCESSES, THREADS, each=EACH)
    per_team = collections.Counter()
    for allowed, degraded, which in answers:
        assert not degraded
        per_team[TEAMS[which]["team"]] += allowed
    assert len(per_team) == 100 and set(per_team.values()) == {7}, per_team


# --- a primary killed under load -------------------------------------------------------------

RATE, DURATION, KILL_AT = 200, 14.0, 4.0
FAILOVER_WITHIN = 6.0  # node timeout 1 s, the election, the client's new view of the slots
LONGEST_P99 = 0.25
POLICY = {
    "default_tier": "t",
    "levels": [
        {"name": "user", "fail_mode": "open"},
        {"name": "team", "fail_mode": "closed"},
        {"name": "global", "fail_mode": "open"},
    ],
    "tiers": {"t": {"user": [UNLIMITED], "team": [UNLIMITED], "global": [UNLIMITED]}},
}


def request_for(i: int) -> tuple[str, dict]:
    return "/api/v1/decisions", {"keys": {"user": f"u{i % 500}", "team": f"t{i % 100}", "global": "*"}}


def shard_of(answer, shards: int = 16) -> int:
    import zlib

    return zlib.crc32(answer.sent["keys"]["team"].encode()) % shards


def test_killing_a_primary_under_load_fails_no_request_and_decisions_resume_after_failover(disposable_redis_cluster):
    from tests.serving import Service

    cluster = disposable_redis_cluster
    with Service(POLICY, redis_url=cluster.url, workers=2) as service:
        warm(service, body={"keys": {"user": "warm-up", "team": "warm-up", "global": "*"}})
        # The primary that holds the most of the 16 shards' slots.
        first = cluster.nodes[0]
        client = RedisCluster(host="127.0.0.1", port=first.port)
        holders = {shard: client.get_node_from_key(f"la:{{s{shard}}}:x").port for shard in range(16)}
        client.close()
        victim_port = collections.Counter(holders.values()).most_common(1)[0][0]
        victim = next(node for node in cluster.nodes if node.port == victim_port)
        lost = {shard for shard, port in holders.items() if port == victim_port}

        load = Load(service, request_for, rate=RATE, duration=DURATION).start()
        sleep_until(load, KILL_AT)
        victim.kill()
        killed = load.now()
        answers = load.join()
        if any(a.status != 200 for a in answers):
            print(service.read_log())  # the server's traceback, for the failure below

    on_lost = [a for a in answers if shard_of(a) in lost]
    elsewhere = [a for a in answers if shard_of(a) not in lost]
    outage = [a for a in on_lost if killed <= a.started and a.body.get("degraded")]
    back = min(
        (
            a.started
            for a in on_lost
            if a.started > killed
            and not a.body.get("degraded")
            and a.started > max((b.started for b in outage), default=killed)
        ),
        default=None,
    )
    print(
        f"\nprimary killed at {killed:.2f} s, holding {len(lost)} of 16 shards: {describe(answers)}; "
        f"{len(outage)} degraded decisions on its shards; back on Redis "
        f"{(back - killed) if back else float('nan'):.2f} s after the kill"
    )

    assert [a for a in answers if a.status != 200] == []
    assert len(answers) == RATE * DURATION
    # Before the kill, everything on Redis (a busy host may blip now and then).
    assert sum(a.body["degraded"] for a in answers if a.ended < killed) <= RATE * KILL_AT // 100
    # The shards on the other primaries carried on: their own breakers stayed closed. (A busy
    # host may make a call miss the 50 ms timeout now and then, as in the other fault tests:
    # seen up to 3 % with other jobs loading the machine to a load average of 15.)
    blips = [a for a in elsewhere if a.started >= killed and a.body["degraded"]]
    assert len(blips) <= len(elsewhere) // 20, blips[:3]
    # The lost shards' decisions said so, by their fail modes: the team level is closed.
    assert outage, "no decision noticed the dead primary"
    assert all(not a.body["allowed"] and a.body["blocked_by"].startswith("team") for a in outage)
    assert percentile([a.took for a in on_lost if a.started >= killed], 99) <= LONGEST_P99
    # A replica took over and the decisions on those shards are back on Redis.
    assert back is not None and back - killed <= FAILOVER_WITHIN
    assert not any(a.body["degraded"] for a in answers if a.started > killed + FAILOVER_WITHIN)


# --- a slot moved while decisions run: ASK during the move, MOVED after it -------------------


def node_id(node) -> str:
    client = node.client()
    try:
        return client.execute_command("CLUSTER", "MYID").decode()
    finally:
        client.close()


def test_a_slot_moved_mid_run_is_followed_and_counts_each_decision_once(disposable_redis_cluster):
    from core import HierarchicalLimiter, acquire_batch
    from core.stores.cluster import ClusterStore

    cluster = disposable_redis_cluster
    store = ClusterStore(url=cluster.url, timeout=1.0)
    limiter = HierarchicalLimiter.from_config(
        {"user": [UNLIMITED], "team": [{"type": "token_bucket", "capacity": 60, "per_second": 0}]}, store=store
    )
    keys = {"user": "u1", "team": "acme"}
    slot = key_slot(limiter._plan(keys, None).store_plan.keys[0].encode())
    primaries = cluster.primaries()
    # The node that holds the slot, and another primary to move it to.
    probe = RedisCluster(host="127.0.0.1", port=primaries[0].port)
    source_port = probe.get_node_from_key(limiter._plan(keys, None).store_plan.keys[0]).port
    probe.close()
    source = next(n for n in primaries if n.port == source_port)
    target = next(n for n in primaries if n.port != source_port)
    source_id, target_id = node_id(source), node_id(target)

    def run(count):
        decisions = [limiter.acquire(keys) for _ in range(count)]
        assert not any(d.degraded for d in decisions), [d for d in decisions if d.degraded][:1]
        return sum(d.allowed for d in decisions)

    admitted = run(20)  # on the source
    src, dst = source.client(), target.client()
    try:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        admitted += run(10)  # the keys are still on the source
        names = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
        src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *names)
        # Migrated, slot not yet handed over: the source answers ASK, the client follows it.
        admitted += run(10)
        for node in primaries:
            client = node.client()
            client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
            client.close()
        # Handed over: the client's map is stale, the source answers MOVED; single and batched.
        admitted += run(10)
        batch = acquire_batch([(limiter, keys, 1, None)] * 30)
        assert not any(d.degraded for d in batch)
        admitted += sum(d.allowed for d in batch)
    finally:
        src.close()
        dst.close()
    assert admitted == 60  # 80 asked, the team's 60 admitted: none lost, none counted twice
    assert limiter.acquire(keys).allowed is False
    assert limiter.inspect("team", "acme")[0]["state"]["tokens"] == 0
    store.close()
