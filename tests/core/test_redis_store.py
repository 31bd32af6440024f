"""The Redis store on a real redis-server: exact across processes, one round trip per
decision, script cache loss survived, every key named, tagged and expiring.

The engine's behaviour on Redis is covered by the whole engine suite (every test that uses
`build` runs on both stores) and by test_store_contract.py; this module checks what only
a shared, remote store has to get right.
"""

import hashlib
import multiprocessing
import re
import threading
import time
from collections import Counter

import pytest
import redis

from core import RULES, ConfigError, HierarchicalLimiter, ManualClock, store_from_url
from core.stores.connections import IDLE_CHECK, HeldConnections
from core.stores.redis import RedisStore, lua_body, lua_source

from .helpers import (
    concurrency,
    fixed_window,
    gcra,
    register_lifetime_quota,
    sliding_window,
    sliding_window_counter,
    state_of,
    token_bucket,
)
from .lua_loss import losing_the_lua, redis_without_functions  # noqa: F401 (fixtures)

# --- helpers --------------------------------------------------------------------------------

PROCESSES, THREADS = 4, 50
# The stores here wait far longer than the 50 ms default. On a small machine a flood's 200
# threads and the server share a couple of CPUs, and a reply later than 50 ms then makes a
# degraded decision, as it should (test_fail_modes.py checks that); here we judge atomicity.
GENEROUS_TIMEOUT = 2.0
QUOTA = "flood_lifetime_quota"


@pytest.fixture
def lifetime_quota():
    register_lifetime_quota(QUOTA)
    yield {"type": QUOTA}
    RULES.pop(QUOTA, None)


def redis_limiter(url, config, prefix, timeout=GENEROUS_TIMEOUT, **options):
    """A limiter on its own RedisStore; on the server's clock unless one is given."""
    store = RedisStore(url=url, prefix=prefix, timeout=timeout)
    return HierarchicalLimiter.from_config(config, store=store, **options)


def decide_in_threads(url, prefix, config, key_sets, process, threads, requests, start, results, plugins=()):
    """One process's share of a flood: its own limiter and client on the shared Redis, on the
    server's clock; `threads` threads, each making `requests` decisions. Runs in a child."""
    for name in plugins:
        register_lifetime_quota(name)
    limiter = redis_limiter(url, config, prefix)
    admitted, degraded, errors = Counter(), Counter(), []
    lock, ready = threading.Lock(), threading.Barrier(threads)

    def worker(n):
        ready.wait()
        for i in range(requests):
            keys = key_sets[(process * threads + n + i) % len(key_sets)]
            try:
                decision = limiter.acquire(keys)
            except Exception as error:  # reported to the parent, which fails the test
                errors.append(repr(error))
                continue
            with lock:
                admitted[keys.get("user", "*")] += decision.allowed
                degraded[decision.degraded] += 1

    workers = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    start.wait()  # every process has its limiter: go together
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    results.put((dict(admitted), degraded[True], errors))


def flood_from_processes(url, prefix, config, key_sets, requests=1, plugins=()):
    """PROCESSES processes of THREADS threads decide at once; returns the requests admitted
    per user, how many decisions were degraded, and any exception raised."""
    context = multiprocessing.get_context("spawn")  # a clean child: no inherited pool or locks
    start, results = context.Barrier(PROCESSES), context.Queue()
    children = [
        context.Process(
            target=decide_in_threads,
            args=(url, prefix, config, key_sets, p, THREADS, requests, start, results, plugins),
        )
        for p in range(PROCESSES)
    ]
    for child in children:
        child.start()
    try:
        outcomes = [results.get(timeout=60) for _ in children]
    finally:
        for child in children:
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
    admitted, degraded, errors = Counter(), 0, []
    for by_user, degraded_here, errors_here in outcomes:
        admitted.update(by_user)
        degraded += degraded_here
        errors += errors_here
    return admitted, degraded, errors


def limiter_keys(client, prefix):
    """The keys under `prefix`, in either key format: `prefix{...}` or `prefix:...`."""
    return sorted(key.decode() for key in client.scan_iter(match=f"{prefix}[:{{]*"))


# --- exactness across processes -------------------------------------------------------------


@pytest.mark.slow
def test_four_processes_of_fifty_threads_get_exactly_fifty_from_a_bucket_of_fifty(redis_url):
    config = {"user": [token_bucket(50, 0)]}
    admitted, degraded, errors = flood_from_processes(redis_url, "flood", config, [{"user": "hot"}])
    assert errors == []
    assert degraded == 0
    assert admitted["hot"] == 50
    assert state_of(redis_limiter(redis_url, config, "flood"), "user", "hot")["tokens"] == 0


@pytest.mark.slow
def test_four_processes_stop_at_the_team_limit_and_denials_take_nothing_from_the_users(redis_url):
    # Ten users of 8 tokens (80) in one team of 50: the team binds. 400 requests in all.
    config = {"user": [token_bucket(8, 0)], "team": [token_bucket(50, 0)], "global": [token_bucket(1000, 0)]}
    key_sets = [{"user": f"user-{u}", "team": "acme", "global": "*"} for u in range(10)]
    admitted, degraded, errors = flood_from_processes(redis_url, "teams", config, key_sets, requests=2)
    assert errors == [] and degraded == 0
    assert sum(admitted.values()) == 50
    limiter = redis_limiter(redis_url, config, "teams")
    assert state_of(limiter, "team", "acme")["tokens"] == 0
    assert state_of(limiter, "global", "*")["tokens"] == 1000 - 50
    for keys in key_sets:
        user = keys["user"]
        assert admitted[user] <= 8
        # Every token gone from a user's bucket went to an admitted request.
        assert state_of(limiter, "user", user)["tokens"] == 8 - admitted[user], user


@pytest.mark.slow
def test_four_processes_get_exactly_the_quota_of_a_plug_in_rule_decided_optimistically(redis_url, lifetime_quota):
    # A plug-in has no Lua twin: WATCH/MULTI must keep it exact under contention too, and
    # contention is not an outage: no decision may fall back to a fail mode for it.
    config = {"user": [{**lifetime_quota, "total": 50}]}
    admitted, degraded, errors = flood_from_processes(
        redis_url, "optimistic", config, [{"user": "hot"}], requests=3, plugins=[QUOTA]
    )
    assert errors == []
    assert (admitted["hot"], degraded) == (50, 0)


@pytest.mark.slow
def test_more_threads_than_the_client_pool_holds_still_get_exactly_the_capacity(redis_url):
    # redis-py's default pool holds 100 connections; 150 threads deciding at once need more.
    limiter = redis_limiter(redis_url, {"user": [token_bucket(50, 0)]}, "pool")
    ready, decisions, lock = threading.Barrier(150), [], threading.Lock()

    def worker():
        ready.wait()
        for _ in range(2):
            decision = limiter.acquire({"user": "hot"})
            with lock:
                decisions.append(decision)

    workers = [threading.Thread(target=worker) for _ in range(150)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    assert sum(d.degraded for d in decisions) == 0
    assert sum(d.allowed for d in decisions) == 50


# --- one round trip per decision -----------------------------------------------------------

# Three levels, every built-in rule type, a shadow rule: one script call decides them all.
EVERY_RULE = {
    "user": [token_bucket(5, 1), sliding_window(3, 60, counts="requests")],
    "team": [gcra(2, 4), fixed_window(20, 60), concurrency(50)],
    "global": [sliding_window_counter(100, 60), token_bucket(2, 0.1, shadow=True)],
}
# The commands the Lua may run: Redis 7.0 counts those in commandstats too.
SCRIPT_COMMANDS = {name.lower() for name in re.findall(r"redis\.call\('(\w+)'", lua_source())}


def stream_of_decisions(limiter, count):
    """`count` decisions over a few key sets: allowed ones, denials, some holding a lease."""
    return [limiter.acquire({"user": f"user-{i % 3}", "team": "acme", "global": "*"}) for i in range(count)]


def test_each_decision_is_one_fcall_in_commandstats(redis_url, redis_server):
    limiter = redis_limiter(redis_url, EVERY_RULE, "trips")
    stream_of_decisions(limiter, 1)  # connects and loads the library: not the hot path
    admin = redis_server.client()
    admin.config_resetstat()
    decisions = stream_of_decisions(limiter, 30)
    stats = admin.info("commandstats")
    assert {d.allowed for d in decisions} == {True, False}
    assert stats["cmdstat_fcall"]["calls"] == 30
    assert stats["cmdstat_fcall"]["failed_calls"] == 0
    # Redis 7.0 also counts, here and in total_commands_processed, every command a function
    # runs (MGET, SET, ZADD, TIME...), so neither total tells the client's commands apart.
    # What can be asserted: besides FCALL, only commands the Lua runs and our own RESETSTAT
    # and INFO show up. No EVALSHA, FUNCTION LOAD, GET of a key, PING or MULTI: the next
    # test checks on the wire that the client sent FCALL and nothing else.
    others = {name.removeprefix("cmdstat_") for name in stats} - {"fcall"}
    assert others <= SCRIPT_COMMANDS | {"config|resetstat", "info"}, others - SCRIPT_COMMANDS


def commands_sent(server, limiter, count):
    """What the client sent while making `count` decisions, by command name, in order, as
    MONITOR shows it (it tells a client's commands from those the Lua runs)."""
    watcher, marker = server.client(socket_timeout=5), server.client()
    marker.ping()  # connected now, so that its ECHO below comes without a HELLO
    sent = []
    with watcher.monitor() as monitor:
        decisions = stream_of_decisions(limiter, count)
        marker.echo("end of the stream")
        for command in monitor.listen():
            if command["command"] == "ECHO end of the stream":
                break
            if command["client_type"] != "lua":
                sent.append(command["command"].split()[0])
    assert {d.allowed for d in decisions} == {True, False}
    return sent


def test_the_client_sends_nothing_but_one_fcall_per_decision(redis_url, redis_server):
    limiter = redis_limiter(redis_url, EVERY_RULE, "wire")
    stream_of_decisions(limiter, 1)
    assert commands_sent(redis_server, limiter, 20) == ["FCALL"] * 20


# --- the Lua lost by the server: a restart without persistence, a flush --------------------


def test_a_server_without_functions_gets_every_decision_by_one_evalsha(redis_without_functions):
    limiter = redis_limiter(redis_without_functions.url, EVERY_RULE, "old")
    stream_of_decisions(limiter, 1)  # FCALL is unknown: the store goes over to EVALSHA
    assert commands_sent(redis_without_functions, limiter, 20) == ["EVALSHA"] * 20


def test_the_library_is_named_by_the_hash_of_its_source_and_leaves_other_versions_alone(redis_url, redis_server):
    admin = redis_server.client()
    # Another deployment's library, loaded before ours: a different hash, a different name.
    admin.function_load(
        "#!lua name=limiter_admin_0000000000000000\n"
        "redis.register_function('limiter_admin_decide_0000000000000000',"
        " function() return 'the other version' end)",
        replace=True,
    )
    limiter = redis_limiter(redis_url, EVERY_RULE, "versions")
    assert limiter.acquire({"user": "u", "team": "t", "global": "*"}).allowed
    digest = hashlib.sha1(lua_body().encode()).hexdigest()[:16]
    assert limiter.store.library == f"limiter_admin_{digest}"
    libraries = {dict(zip(entry[::2], entry[1::2]))[b"library_name"].decode() for entry in admin.function_list()}
    assert {f"limiter_admin_{digest}", "limiter_admin_0000000000000000"} <= libraries
    assert admin.fcall("limiter_admin_decide_0000000000000000", 0) == b"the other version"


def test_losing_the_lua_mid_stream_costs_no_error_and_counts_nothing_twice(losing_the_lua):
    url, flush = losing_the_lua
    config = {"user": [token_bucket(30, 0)], "team": [sliding_window(1000, 3600)]}
    limiter = redis_limiter(url, config, "flush", clock=ManualClock())
    decisions = []
    for i in range(50):
        if i in (0, 10, 11, 29, 30):
            flush()
        decisions.append(limiter.acquire({"user": "u", "team": "t"}))
    assert [d.allowed for d in decisions] == [True] * 30 + [False] * 20
    assert not any(d.degraded for d in decisions)
    # The team's log holds one entry per admitted request: nothing ran twice.
    assert state_of(limiter, "team", "t")["entries"] == 30


def test_reservations_survive_losing_the_lua_and_count_nothing_twice(losing_the_lua):
    url, flush = losing_the_lua
    config = {"user": [token_bucket(100, 0)], "team": [concurrency(5)]}
    limiter = redis_limiter(url, config, "flush-reservations", clock=ManualClock())
    keys = {"user": "u", "team": "t"}
    flush()
    _, reservation = limiter.reserve(keys, cost=10)
    flush()
    assert limiter.settle(reservation.id, 4).refunded == 6
    flush()
    decision = limiter.acquire(keys, cost=2)
    flush()
    assert limiter.release(keys, decision.lease) == 1
    assert state_of(limiter, "user", "u")["tokens"] == 100 - 4 - 2
    assert state_of(limiter, "team", "t")["in_flight"] == 0


def test_losing_the_lua_under_a_flood_of_threads_counts_every_admitted_request_once(losing_the_lua):
    url, flush = losing_the_lua
    config = {"user": [token_bucket(1000, 0)], "team": [sliding_window(1000, 3600)]}
    limiter = redis_limiter(url, config, "flushes", clock=ManualClock())
    decisions, lock = [], threading.Lock()

    def worker():
        for _ in range(40):
            decision = limiter.acquire({"user": "u", "team": "t"})
            with lock:
                decisions.append(decision)

    workers = [threading.Thread(target=worker) for _ in range(8)]
    for thread in workers:
        thread.start()
    flush_at = [100, 220]  # twice, while the threads decide
    while flush_at and any(thread.is_alive() for thread in workers):
        if len(decisions) >= flush_at[0]:
            flush()
            flush_at.pop(0)
        time.sleep(0.0005)  # polling the count, not aiming at an edge
    for thread in workers:
        thread.join()
    assert flush_at == []
    assert len(decisions) == 320
    assert all(d.allowed and not d.degraded for d in decisions)
    assert state_of(limiter, "user", "u")["tokens"] == 1000 - 320
    assert state_of(limiter, "team", "t")["entries"] == 320


# --- held connections ------------------------------------------------------------------------

PING = b"*1\r\n$4\r\nPING\r\n"


def test_a_held_connection_the_server_closed_while_it_sat_idle_is_opened_again_before_use(redis_url, redis_server):
    clock = ManualClock()
    client = redis.Redis.from_url(redis_url)
    held = HeldConnections(client.connection_pool, clock=clock)
    assert held.call(PING) == b"PONG"
    assert redis_server.client().client_kill_filter(_type="normal", skipme=True) >= 1
    clock.advance(IDLE_CHECK * 2)
    assert held.call(PING) == b"PONG"
    assert len(held.idle) == 1  # the same connection, connected again
    client.close()


def test_stores_on_one_client_share_its_held_connections(redis_url):
    client = redis.Redis.from_url(redis_url)
    stores = [RedisStore(client=client, prefix=f"share{i}") for i in range(50)]
    for store in stores:
        limiter = HierarchicalLimiter.from_config({"user": [token_bucket(1, 0)]}, store=store)
        assert limiter.acquire({"user": "u"}).allowed
    assert stores[0]._held is stores[-1]._held
    assert len(stores[0]._held.idle) == 1  # one call at a time: one connection
    client.close()


def decide_in_a_child(limiter, results):
    results.put([limiter.acquire({"user": "u"}) for _ in range(3)])
    held = limiter.store._held
    results.put(held.idle[-1][0]._sock.getsockname())


def test_a_forked_child_decides_on_connections_of_its_own_and_nothing_is_lost(redis_url):
    limiter = redis_limiter(redis_url, {"user": [token_bucket(10, 0)]}, "fork")
    assert limiter.acquire({"user": "u"}).allowed  # the parent holds a connection now
    parents = limiter.store._held.idle[-1][0]._sock.getsockname()
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=decide_in_a_child, args=(limiter, results))
    child.start()
    in_child, childs = results.get(timeout=30), results.get(timeout=30)
    child.join(30)
    in_parent = [limiter.acquire({"user": "u"}) for _ in range(3)]
    assert childs != parents  # the child never wrote on its parent's socket
    assert all(d.allowed and not d.degraded for d in in_child + in_parent)
    assert state_of(limiter, "user", "u")["tokens"] == 10 - 7


# --- keys: names, hash tags, expiry ---------------------------------------------------------


def test_a_compact_key_is_the_prefix_and_a_hash_tag_of_10_characters(redis_url, redis_server):
    limiter = redis_limiter(redis_url, EVERY_RULE, "la")
    limiter.acquire({"user": "u1", "team": "t1", "global": "*"})
    keys = limiter_keys(redis_server.client(), "la")
    assert len(keys) == 7  # one per stateful rule, the shadow rule's too
    assert all(re.fullmatch(r"la\{[A-Za-z0-9_-]{10}\}", key) for key in keys), keys
    assert all(len(key) == 14 for key in keys)  # the longest that Redis 7.0 keeps smallest
    # The name depends on the level, the key and the rule, and on nothing else.
    again = redis_limiter(redis_url, EVERY_RULE, "la")
    assert again.store.prepare(again._plan({"user": "u1"}, None).checks).keys == tuple(
        limiter.store.prepare(limiter._plan({"user": "u1"}, None).checks).keys
    )


def test_a_key_format_must_be_known(redis_url):
    with pytest.raises(ConfigError, match="key_format: must be one of compact, readable"):
        RedisStore(url=redis_url, key_format="short")


def test_every_readable_key_carries_the_prefix_and_a_hash_tag_of_its_level_and_key(redis_url, redis_server):
    store = RedisStore(url=redis_url, prefix="acme-limits", timeout=GENEROUS_TIMEOUT, key_format="readable")
    limiter = HierarchicalLimiter.from_config(EVERY_RULE, store=store)
    limiter.acquire({"user": "u1", "team": "t1", "global": "*"})
    keys = limiter_keys(redis_server.client(), "acme-limits")
    assert len(keys) == 7  # one per stateful rule, the shadow rule's too
    tags = Counter()
    for key in keys:
        match = re.fullmatch(r"acme-limits:\{([^{}]+)\}:[0-9a-z]+", key)
        assert match, key
        tags[match.group(1)] += 1
    # Two rules of one key share its tag: its state stays on one cluster node.
    assert tags == {"user:u1": 2, "team:t1": 3, "global:*": 2}


def test_two_prefixes_on_one_server_share_nothing(redis_url):
    config = {"user": [token_bucket(1, 0)]}
    first, second = (redis_limiter(redis_url, config, prefix) for prefix in ("one", "two"))
    assert first.acquire({"user": "u"}).allowed
    assert second.acquire({"user": "u"}).allowed
    assert not first.acquire({"user": "u"}).allowed


@pytest.mark.parametrize("clock_kind", ["server clock", "injected clock"])
def test_every_limiter_key_has_a_ttl_after_a_mixed_workload(redis_url, redis_server, clock_kind):
    clock = ManualClock(1000.0) if clock_kind == "injected clock" else None
    limiter = redis_limiter(redis_url, EVERY_RULE, "ttl", clock=clock, priorities={"batch": {"watermark": 0.5}})
    held = []
    for i in range(60):
        keys = {"user": f"user-{i % 4}", "team": f"team-{i % 2}", "global": "*"}
        decision = limiter.acquire(keys, cost=1 + i % 3, priority="batch" if i % 5 == 0 else None)
        if decision.lease:
            held.append((keys, decision.lease))
        if i % 7 == 0:
            limiter.explain(keys, 2)
        if clock is not None:
            clock.advance(0.5)
    for keys, lease in held[::2]:
        limiter.release(keys, lease)
    limiter.reset("user", "user-3")
    client = redis_server.client()
    keys = limiter_keys(client, "ttl")
    # Every rule has state somewhere (the key names cannot say which rule: worked out here).
    used = {"user": [f"user-{n}" for n in range(4)], "team": ["team-0", "team-1"], "global": ["*"]}
    holding = {
        (level, i)
        for level, rules in limiter.levels.items()
        for i, rule in enumerate(rules)
        for key in used[level]
        if limiter.store.key_name(level, key, rule) in keys
    }
    assert len(holding) == 7
    no_expiry = [key for key in keys if not client.pttl(key) > 0]
    assert no_expiry == []


# --- the optimistic path of plug-in rules ----------------------------------------------------


def test_a_denial_on_the_optimistic_path_after_a_log_emptied_raises_nothing(redis_url, lifetime_quota):
    # Rewriting a log with no entry left once sent RPUSH without values: a ResponseError.
    clock = ManualClock()
    config = {"user": [{**lifetime_quota, "total": 1}, sliding_window(5, 10)]}
    limiter = redis_limiter(redis_url, config, "emptied", clock=clock)
    assert limiter.acquire({"user": "u"}).allowed
    clock.advance(10)  # the log's one entry leaves the window
    denied = limiter.acquire({"user": "u"})  # the quota denies
    assert not denied.allowed
    assert denied.blocked_by == f"user: {QUOTA}(1)"


BESIDE_A_PLUG_IN = {
    "token_bucket": token_bucket(10, 1),
    "token_bucket that never refills": token_bucket(10, 0),
    "gcra": gcra(1, 10),
    "fixed_window": fixed_window(10, 60),
    "sliding_window": sliding_window(10, 60),
    "sliding_window_counter": sliding_window_counter(10, 60),
    "concurrency": concurrency(10, lease=60),
}


@pytest.mark.parametrize("spec", BESIDE_A_PLUG_IN.values(), ids=BESIDE_A_PLUG_IN.keys())
def test_a_denial_on_the_optimistic_path_leaves_the_other_rules_expiry_alone(
    redis_url, redis_server, lifetime_quota, spec
):
    # Beside a plug-in, built-in rules are written from Python. A denial takes nothing, so
    # no state may come out of it expiring sooner than it went in: a state that expires
    # early is a limit that starts afresh early.
    limiter = redis_limiter(redis_url, {"user": [{**lifetime_quota, "total": 2}, spec]}, "expiry", clock=ManualClock())
    assert [limiter.acquire({"user": "u"}).allowed for _ in range(2)] == [True, True]
    client = redis_server.client()
    key = limiter.store.key_name("user", "u", limiter.levels["user"][1])
    before = client.pttl(key)
    assert not limiter.acquire({"user": "u"}).allowed
    assert client.pttl(key) > before - 500, f"PTTL was {before} ms before the denial"


# --- choosing the store by URL --------------------------------------------------------------


def test_a_redis_url_gives_a_redis_store_that_decides_on_that_server(redis_url, redis_server):
    store = store_from_url(redis_url)
    assert isinstance(store, RedisStore)
    limiter = HierarchicalLimiter.from_config({"user": [token_bucket(1, 0)]}, store=store)
    assert [limiter.acquire({"user": "u"}).allowed for _ in range(2)] == [True, False]
    assert limiter_keys(redis_server.client(), "la") != []  # the default prefix
    store.close()


def test_store_options_pass_through_the_url(redis_url, redis_server):
    store = store_from_url(redis_url, prefix="tenant-a")
    limiter = HierarchicalLimiter.from_config({"user": [token_bucket(1, 0)]}, store=store)
    limiter.acquire({"user": "u"})
    assert len(limiter_keys(redis_server.client(), "tenant-a")) == 1
    store.close()


# --- readiness ------------------------------------------------------------------------------


def test_a_ping_answers_when_redis_does_and_raises_store_unavailable_when_not(redis_url, unreachable_redis_url):
    from core import MemoryStore, StoreUnavailable

    MemoryStore().ping()  # in this process: nothing to ask
    RedisStore(url=redis_url).ping()
    started = time.perf_counter()
    with pytest.raises(StoreUnavailable):
        RedisStore(url=unreachable_redis_url).ping()
    assert time.perf_counter() - started < 1.0
