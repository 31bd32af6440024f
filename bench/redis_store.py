"""Decisions per second of a 3-level decision on the Redis store (user, team, global; one
token bucket each, one FCALL), side by side against one redis-server in one process with:

- the `limits` library's RedisStorage, fixed window and moving window, one level only
  (`hit(item, "user", user)`): one script call each;
- a raw redis-py EVALSHA of a trivial one-key script (INCRBY), on the same kind of client our
  store uses (`core.stores.redis.connect`): one round trip through redis-py's full command
  path, the floor the targets are set against;
- the same INCRBY as a function, called with FCALL packed in advance on the store's held
  connections (`core.stores.connections.held_connections`): one round trip by the path our store
  takes, the floor of that path.

Then the Redis memory per key: `INFO memory` used_memory before and after 100,000 keys made
through our store, for a token bucket and, for comparison, a fixed window and a day's quota.

`--quota` adds our decision with a quota at the team level (a month's, in Europe/Berlin) in
place of the team's token bucket, and with a soft quota beside the bucket: the period's bounds
are computed in Python and handed to the script per call.

Run: .venv/bin/python bench/redis_store.py [--decisions N] [--rounds R] [--keys K] [--url URL] [--quota]
Without --url it starts its own redis-server on a free loopback port (no RDB, no AOF) and
stops it at the end. The memory part empties the server (FLUSHALL), so with --url the server
must be empty or --flush given.

Each contender runs R rounds interleaved with the others; the best round counts. Ours reads
the server's clock (Redis TIME), limits the client's wall clock. Every contender's time inside
its script call (EVALSHA or FCALL) comes from INFO commandstats ("server us"); what is left of
a decision is the client, the kernel, the loopback and the server's reading and answering of
the command.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from limits import parse, strategies  # noqa: E402
from limits.storage import RedisStorage  # noqa: E402

from core import HierarchicalLimiter  # noqa: E402
from core.stores.connections import held_connections  # noqa: E402
from core.stores.redis import RedisError, RedisStore, connect  # noqa: E402

USERS, TEAMS = 1000, 50
LIMITS = {"user": (100, 50), "team": (2000, 1000), "global": (1_000_000, 100_000)}
RAW_SCRIPT = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
RAW_LIBRARY = (
    f"#!lua name=bench_raw\nredis.register_function('bench_raw_incrby', function(KEYS, ARGV) {RAW_SCRIPT} end)"
)
# Memory rules: TTLs far longer than the ~20 s it takes to make the keys, so none expires
# before used_memory is read: one take leaves this token bucket full again in 600 s.
MEMORY_RULES = {
    "token bucket": {"type": "token_bucket", "capacity": 100, "per_second": 1 / 600},
    "fixed window": {"type": "fixed_window", "limit": 100, "window": 86400},
    "quota (day)": {"type": "quota", "limit": 100, "period": "day"},
}
EXPECTED_ENCODING = {"token bucket": "int", "fixed window": "embstr", "quota (day)": "embstr"}
# The team level's rules in the --quota variants: a hard month's quota where the bucket was,
# and the bucket with a soft quota beside it. The limits are far above the run's traffic.
QUOTA = {"type": "quota", "limit": 10**12, "period": "month", "timezone": "Europe/Berlin"}
QUOTA_VARIANTS = {
    "ours: team quota for team bucket": [QUOTA],
    "ours: team bucket + soft quota": ["bucket", {**QUOTA, "mode": "soft"}],
}
SAMPLE = 1000  # keys checked for a TTL and their encoding
# Our clients' timeout: a busy host's slow reply is then measured, not failed open (which
# would stop the run); how long a client waits does not change what a call costs.
PATIENCE = 1.0


@contextlib.contextmanager
def redis_server(url: str | None) -> Iterator[str]:
    """The URL of a redis-server: the one given, or our own on a free loopback port."""
    if url:
        yield url
        return
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    workdir = tempfile.mkdtemp(prefix="bench-redis-")
    port = free_port()
    server = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"redis://127.0.0.1:{port}/0"
        wait_for(url, server)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(url: str, server: subprocess.Popen) -> None:
    client = connect(url, timeout=1.0)
    deadline = time.monotonic() + 10
    while True:
        if server.poll() is not None:
            raise SystemExit(f"redis-server exited: {server.stderr.read().decode().strip()}")
        try:
            client.ping()
            client.close()
            return
        except RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def workload(n: int) -> list[dict]:
    """The same mix as bench/engine.py: 1,000 users in 50 teams and one global key."""
    rng = random.Random(7)
    users = [(f"user-{i}", f"team-{i % TEAMS}") for i in range(USERS)]
    picks = [users[rng.randrange(USERS)] for _ in range(n)]
    return [{"user": user, "team": team, "global": "*"} for user, team in picks]


def ours(url: str, team: list | None = None) -> Callable[[list[dict]], tuple[float, int]]:
    config = {level: [{"type": "token_bucket", "capacity": c, "per_second": r}] for level, (c, r) in LIMITS.items()}
    if team is not None:  # the --quota variants: "bucket" stands for the team's token bucket
        config["team"] = [config["team"][0] if rule == "bucket" else rule for rule in team]
    store = RedisStore(url=url, timeout=PATIENCE)
    acquire = HierarchicalLimiter.from_config(config, store=store).acquire

    def run(requests: list[dict]) -> tuple[float, int]:
        admitted = degraded = 0
        start = time.perf_counter()
        for keys in requests:
            decision = acquire(keys)
            admitted += decision.allowed
            degraded += decision.degraded
        elapsed = time.perf_counter() - start
        if degraded:  # the store failed open: these decisions never reached Redis
            raise SystemExit(f"{degraded} decisions were degraded (Redis timed out); rerun")
        return elapsed, admitted

    return run


def limits_hits(url: str, strategy) -> Callable[[list[dict]], tuple[float, int]]:
    # One prefix per strategy: both would name the same key, a counter for one, a list for the other.
    hit = strategy(RedisStorage(url, key_prefix=f"LIMITS-{strategy.__name__}")).hit
    item = parse(f"{LIMITS['user'][0]}/second")

    def run(requests: list[dict]) -> tuple[float, int]:
        users = [keys["user"] for keys in requests]
        admitted = 0
        start = time.perf_counter()
        for user in users:
            admitted += hit(item, "user", user)
        return time.perf_counter() - start, admitted

    return run


def raw_evalsha(url: str) -> Callable[[list[dict]], tuple[float, int]]:
    client = connect(url, timeout=PATIENCE)
    sha = client.script_load(RAW_SCRIPT)
    evalsha = client.evalsha

    def run(requests: list[dict]) -> tuple[float, int]:
        keys = [f"raw:{{{keys['user']}}}" for keys in requests]
        start = time.perf_counter()
        for key in keys:
            evalsha(sha, 1, key, 1)
        return time.perf_counter() - start, len(keys)

    return run


def raw_fcall(url: str) -> Callable[[list[dict]], tuple[float, int]]:
    client = connect(url, timeout=PATIENCE)
    client.function_load(RAW_LIBRARY, replace=True)
    call = held_connections(client.connection_pool).call

    def run(requests: list[dict]) -> tuple[float, int]:
        commands = [
            b"*5\r\n$5\r\nFCALL\r\n$16\r\nbench_raw_incrby\r\n$1\r\n1\r\n$%d\r\n%s\r\n$1\r\n1\r\n" % (len(key), key)
            for key in (f"raw:{{{keys['user']}}}".encode() for keys in requests)
        ]
        start = time.perf_counter()
        for command in commands:
            call(command)
        return time.perf_counter() - start, len(commands)

    run.client = client  # the held connections refer to its pool weakly: keep it alive
    return run


SCRIPT_CALLS = ("cmdstat_evalsha", "cmdstat_fcall")


def server_usec(admin, reset: bool = False) -> tuple[int, int]:
    """(EVALSHA and FCALL calls, their microseconds) since the last reset, from INFO
    commandstats."""
    if reset:
        admin.config_resetstat()
        return 0, 0
    stats = admin.info("commandstats")
    return (
        sum(stats.get(name, {}).get("calls", 0) for name in SCRIPT_CALLS),
        sum(stats.get(name, {}).get("usec", 0) for name in SCRIPT_CALLS),
    )


def race(url: str, decisions: int, rounds: int, quota: bool = False) -> dict[str, dict]:
    admin = connect(url, timeout=5.0)
    requests = workload(decisions)
    contenders = {
        "ours: 3 levels, one script call": ours(url),
        "limits: fixed window, 1 level": limits_hits(url, strategies.FixedWindowRateLimiter),
        "limits: moving window, 1 level": limits_hits(url, strategies.MovingWindowRateLimiter),
        "raw redis-py EVALSHA, 1 key": raw_evalsha(url),
        "raw FCALL, held connection, 1 key": raw_fcall(url),
    }
    if quota:
        contenders |= {name: ours(url, team) for name, team in QUOTA_VARIANTS.items()}
    best = {name: {"seconds": float("inf")} for name in contenders}
    for _ in range(rounds):
        for name, run in contenders.items():
            server_usec(admin, reset=True)
            seconds, admitted = run(requests)
            calls, usec = server_usec(admin)
            if seconds < best[name]["seconds"]:
                best[name] = {
                    "seconds": seconds,
                    "admitted": admitted,
                    "server_us": usec / calls if calls else float("nan"),
                }
    admin.close()
    return best


def bytes_per_key(url: str, rule: dict, keys: int) -> dict:
    """used_memory after minus before `keys` distinct user keys, one acquire each, on an
    emptied server; then a sample of the keys is checked for a TTL and its encoding."""
    admin = connect(url, timeout=30.0)
    store = RedisStore(url=url, timeout=1.0)
    limiter = HierarchicalLimiter.from_config({"user": [rule]}, store=store)
    limiter.acquire({"user": "warm-up"})  # the library is loaded before "before"
    admin.flushall()
    before = admin.info("memory")["used_memory"]
    acquire = limiter.acquire
    for i in range(keys):
        if not acquire({"user": f"user-{i}"}).allowed:
            raise SystemExit(f"user-{i} was denied on its first take")
    after = admin.info("memory")["used_memory"]
    count = admin.dbsize()
    if count != keys:  # a TTL ran out during the measurement: the figure would be too low
        raise SystemExit(f"{keys - count} of {keys} keys expired before used_memory was read; rerun")
    sample = [admin.randomkey() for _ in range(SAMPLE)]
    ttls = [admin.pttl(key) for key in sample]
    encodings = {text(admin.object("encoding", key)) for key in sample}
    found = {
        "per_key": (after - before) / keys,
        "keys": count,
        "ttl_min_s": min(ttls) / 1000,
        "no_ttl": sum(ttl < 0 for ttl in ttls),
        "encodings": sorted(encodings),
        "key": text(sample[0]),
        "usage": admin.memory_usage(sample[0], samples=0),
    }
    admin.flushall()
    store.close()
    admin.close()
    return found


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def report(best: dict[str, dict], decisions: int, rounds: int, memory: dict[str, dict], keys: int) -> None:
    ours_name, raw_name = "ours: 3 levels, one script call", "raw redis-py EVALSHA, 1 key"
    rate = {name: decisions / found["seconds"] for name, found in best.items()}
    admitted = ", ".join(f"{found['admitted']:,}" for found in best.values())
    print(
        f"{decisions:,} decisions x {rounds} rounds, best round, Python {sys.version.split()[0]};"
        f" admitted in the best round, in table order: {admitted}"
    )
    print(f"{'contender':36} {'decisions/s':>12} {'us/decision':>12} {'server us':>10} {'ours is':>9}")
    for name, value in rate.items():
        print(
            f"{name:36} {value:12,.0f} {1e6 / value:12.2f} {best[name]['server_us']:10.2f}"
            f" {rate[ours_name] / value:8.2f}x"
        )
    ours_us, raw_us = 1e6 / rate[ours_name], 1e6 / rate[raw_name]
    held_us = 1e6 / rate["raw FCALL, held connection, 1 key"]
    print(
        f"ours / raw evalsha: {ours_us / raw_us:.2f}x the time per decision (target <= 1.3x);"
        f" outside the script call: ours {ours_us - best[ours_name]['server_us']:.2f} us,"
        f" raw {raw_us - best[raw_name]['server_us']:.2f} us"
    )
    print(
        f"ours / raw FCALL on a held connection (our own call path): {ours_us / held_us:.2f}x the"
        f" time per decision; outside the script call:"
        f" {held_us - best['raw FCALL, held connection, 1 key']['server_us']:.2f} us"
    )
    fixed = rate[ours_name] / rate["limits: fixed window, 1 level"]
    print(f"ours / limits fixed window: {fixed:.2f}x the decisions per second (target >= 1.0x)")
    if memory:
        print(
            f"Redis memory per key: used_memory after - before {keys:,} keys, through our store"
            " (target: token bucket <= 120 B)"
        )
    for name, found in memory.items():
        ttl = (
            f"all with a TTL (shortest {found['ttl_min_s']:.0f} s)"
            if not found["no_ttl"]
            else f"{found['no_ttl']} WITHOUT a TTL"
        )
        print(
            f"  {name:13} {found['per_key']:6.1f} B/key; {found['keys']:,} keys in the db; {SAMPLE}"
            f" sampled: {ttl}, encoding {'/'.join(found['encodings'])} (expected"
            f" {EXPECTED_ENCODING[name]}); MEMORY USAGE {found['key']!r}: {found['usage']} B"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decisions", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keys", type=int, default=100_000, help="keys for bytes per key (0: skip)")
    parser.add_argument("--url", help="an existing redis-server instead of our own")
    parser.add_argument("--flush", action="store_true", help="allow FLUSHALL on --url")
    parser.add_argument("--quota", action="store_true", help="also time our decision with a quota (see above)")
    args = parser.parse_args()
    with redis_server(args.url) as url:
        if args.url and args.keys and not args.flush and connect(url).dbsize():
            raise SystemExit("the server holds keys; the memory part needs FLUSHALL (pass --flush)")
        best = race(url, args.decisions, args.rounds, args.quota)
        memory = {name: bytes_per_key(url, rule, args.keys) for name, rule in MEMORY_RULES.items() if args.keys}
    report(best, args.decisions, args.rounds, memory, args.keys)


if __name__ == "__main__":
    main()
