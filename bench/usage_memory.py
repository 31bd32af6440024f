"""Redis memory of the per-tenant usage statistics (core/stats/), measured for N active tenants.

One tenant's steady state is written through the real code path (DenialStats.record and
flush, on a manual clock, into a real redis-server): every minute of the last
LIMITER_USAGE_MINUTE_HOURS and every hour of the last LIMITER_USAGE_HOUR_DAYS has decisions,
denials by three rules, shadow denials, a fractional cost and more users than the hour keeps
(user_top_k), which is the most a tenant can hold. Keys that Redis would have expired by then
(their bucket is older than its retention: the simulation runs 30 days in seconds, and a
key's TTL is counted from when it was written) are deleted, as Redis would. The tenant's keys
are then copied to N - 1 more tenants with DUMP and RESTORE (the same bytes and encoding),
and Redis's used_memory is read before and after: the memory of N such tenants, as Redis
reports it. The keys shared by all tenants (totals, top sets, the users seen for search) are
bounded whatever N is; the seen set is filled to its bound and reported apart.

Run: .venv/bin/python bench/usage_memory.py [--tenants 10000] [--url redis://...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.redis_store import redis_server  # noqa: E402
from core import ManualClock  # noqa: E402
from core.decision import RATE_LIMITED, Decision, allowed  # noqa: E402
from core.stats import DAY, HOUR, MINUTE, QUARTER, SEEN_USERS, TTL_SLACK, DenialStats  # noqa: E402
from core.stores.redis import connect  # noqa: E402

START = 1_800_000_000 - 1_800_000_000 % DAY
RULES = ("user: token_bucket(50, 10/s)", "team: token_bucket(1000, 100/s)", "global: token_bucket(1e+05, 1e+04/s)")
SHADOW = "user: sliding_window(600, 60) per request"
TENANT = "t00000"
USERS_PER_HOUR = 25  # more than user_top_k (20): the hour's sets are full


def decisions_for(stats: DenialStats, minute_index: int, users: int) -> None:
    """One minute's traffic of the tenant: allowed with cost, a denial, a shadow denial."""
    user = f"user-{minute_index % users:03}"
    keys = {"user": user, "team": TENANT, "global": "*"}
    stats.record(keys, allowed(5.0), cost=1.5)
    stats.record(keys, allowed(5.0)._replace(shadow_blocked=(SHADOW,)), cost=2)
    stats.record(keys, Decision(False, 1.0, RULES[minute_index % len(RULES)], RATE_LIMITED, 0.0))


def simulate_one_tenant(stats: DenialStats, clock: ManualClock) -> float:
    """Every hour of the first days (all users, all rules each hour), then every minute of
    the last day; returns the simulated now."""
    hours = int(stats.usage_hours // HOUR)
    minutes = int(stats.usage_minutes // MINUTE)
    first_minute_hour = hours - minutes // 60
    for hour in range(first_minute_hour):
        clock.advance(START + hour * HOUR - clock())
        for i in range(USERS_PER_HOUR * len(RULES)):
            decisions_for(stats, i, USERS_PER_HOUR)
        stats.flush()
    for minute in range(minutes):
        clock.advance(START + first_minute_hour * HOUR + minute * MINUTE - clock())
        decisions_for(stats, minute, USERS_PER_HOUR)
        stats.flush()
    return clock()


def fill_seen_users(stats: DenialStats) -> None:
    """SEEN_USERS distinct users seen in the last minute: the search set at its bound."""
    for i in range(SEEN_USERS):
        stats.record({"user": f"seen-{i:05}", "team": TENANT}, allowed(5.0), cost=1)
        if i % 150 == 149:
            stats.flush()
    stats.flush()


RETENTION_OF = {
    "um": ("usage_minutes", QUARTER),
    "uh": ("usage_hours", DAY),
    "ub": ("usage_hours", DAY),
    "uu": ("usage_minutes", HOUR),
    "ux": ("usage_minutes", HOUR),
    "m": ("retention", MINUTE),
    "k": ("retention", MINUTE),
    "t": ("retention", MINUTE),
    "h": ("retention", HOUR),
    "ht": ("retention", HOUR),
}


def expire_as_redis_would(client, stats: DenialStats, now: float) -> int:
    """Delete the keys whose bucket no window can read any more (what their TTL does)."""
    doomed = []
    for raw in client.scan_iter("la:{stats}:*", count=10_000):
        name = raw.decode()
        parts = name.split(":")
        kind = parts[2]
        if kind not in RETENTION_OF:
            continue
        option, span = RETENTION_OF[kind]
        if int(parts[3]) + span + getattr(stats, option) + TTL_SLACK <= now:
            doomed.append(name)
    for i in range(0, len(doomed), 10_000):
        client.delete(*doomed[i : i + 10_000])
    return len(doomed)


def tenant_keys(client) -> list[str]:
    return sorted(raw.decode() for raw in client.scan_iter(f"la:{{stats}}:u*:*:{TENANT}", count=10_000))


def copy_tenant(client, names: list[str], tenants: int) -> None:
    """RESTORE the tenant's keys under tenants t00001 ... with the same bytes and TTL."""
    dumps = [(name, client.dump(name), max(client.pttl(name), 1)) for name in names]
    pipe = client.pipeline(transaction=False)
    queued = 0
    for i in range(1, tenants):
        suffix = f"t{i:05}"
        for name, payload, ttl in dumps:
            pipe.restore(name[: -len(TENANT)] + suffix, ttl, payload, replace=True)
            queued += 1
            if queued >= 20_000:
                pipe.execute()
                queued = 0
    pipe.execute()


def memory(client) -> int:
    client.execute_command("MEMORY", "PURGE")
    return int(client.info("memory")["used_memory"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--url", help="an empty redis-server to use instead of our own")
    parser.add_argument("--minute-hours", type=float, default=24)
    parser.add_argument("--hour-days", type=float, default=30)
    args = parser.parse_args()
    with redis_server(args.url) as url:
        client = connect(url, timeout=60)
        client.flushall()
        empty = memory(client)
        clock = ManualClock(START)
        stats = DenialStats(
            client=client,
            clock=clock,
            flush_every=None,
            usage_minutes=args.minute_hours * HOUR,
            usage_hours=args.hour_days * DAY,
            tier_of=lambda tenant: "pro",
        )
        began = time.monotonic()
        now = simulate_one_tenant(stats, clock)
        shared_before_seen = memory(client)
        fill_seen_users(stats)
        dropped = expire_as_redis_would(client, stats, clock())
        names = tenant_keys(client)
        by_kind: dict[str, list[int]] = defaultdict(list)
        for name in names:
            by_kind[name.split(":")[2]].append(int(client.memory_usage(name, samples=0)))
        encodings = {client.object("encoding", name).decode() for name in names}
        one = memory(client)
        seen = int(client.memory_usage("la:{stats}:seen", samples=0))
        copy_tenant(client, names, args.tenants)
        many = memory(client)
        per_tenant = (many - one) / (args.tenants - 1)
        print(f"simulated {now - START:.0f} s of traffic in {time.monotonic() - began:.0f} s; {dropped} expired keys")
        print(f"one tenant: {len(names)} keys, encodings {sorted(encodings)}")
        for kind, sizes in sorted(by_kind.items()):
            print(
                f"  {kind}: {len(sizes):4} keys, {sum(sizes):8,} bytes (MEMORY USAGE), "
                f"{sum(sizes) / len(sizes):6.0f} a key"
            )
        print(
            f"used_memory: empty {empty:,}; one tenant and the shared keys {one:,} "
            f"(before the seen set {shared_before_seen:,})"
        )
        print(f"seen users set: {client.zcard('la:{stats}:seen')} members, {seen:,} bytes")
        print(f"{args.tenants:,} tenants: used_memory {many:,} B = {many / 2**20:.1f} MiB")
        print(f"per active tenant: {per_tenant:,.0f} B ({per_tenant / 1024:.1f} KiB)")
        print(f"per tenant over its keys' own MEMORY USAGE: {sum(map(sum, by_kind.values())):,} B")
        client.close()


if __name__ == "__main__":
    main()
