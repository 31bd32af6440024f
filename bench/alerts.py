"""The cost of an alert evaluation round: how long one round takes for N tenants seen.

    .venv/bin/python bench/alerts.py                       # 100, 1,000 and 10,000 tenants; its own redis-server
    .venv/bin/python bench/alerts.py --tenants 500 --rounds 5

A worker's round (policies.services.alerts.AlertRounds.run) on a fresh SQLite database and a
real Redis: every tenant had traffic in the last minute (12 decisions each, counted in the
statistics and flushed), a tenth of them denied more than a fifth of the time. Three alerts:
two denied_share (5m over 0.2, 1h over 0.5) and one quota_used (no quota rules here: each
tenant's quotas are asked all the same). Deliveries go to a loopback port where nothing
listens, on the round's pool: the round never waits for them.

Two figures per N, the best of `--rounds` (wall seconds of the round, in its thread):
- first: the round that fires (one insert per crossing, then the dispatch);
- steady: the next rounds, where nothing new fires (every worker remembers what fired): the
  cost a busy deployment pays every LIMITER_ALERT_EVERY seconds per worker.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

# The project's root in place of bench/, whose http.py would stand for the standard library's.
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATABASE = os.path.join(tempfile.mkdtemp(prefix="bench-alerts-"), "db.sqlite3")
os.environ["DATABASE_URL"] = f"sqlite:///{DATABASE}"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "limiter_admin.settings")

import django  # noqa: E402

django.setup()

import redis  # noqa: E402
from django.core.management import call_command  # noqa: E402

from bench.redis_store import free_port, redis_server  # noqa: E402
from core import Decision, ManualClock  # noqa: E402
from core.decision import RATE_LIMITED, allowed  # noqa: E402
from core.flusher import Flusher  # noqa: E402
from core.stats import DenialStats  # noqa: E402
from core.stores.redis import RedisStore  # noqa: E402
from policies.compile import PolicyCache, install_policy_cache  # noqa: E402
from policies.models import Alert, AlertFiring  # noqa: E402
from policies.policyfile import load_policy  # noqa: E402
from policies.services.alerts import AlertRounds  # noqa: E402
from policies.services.jobs import JobPool  # noqa: E402
from policies.telemetry import install_denial_stats  # noqa: E402

START = 1_780_000_020.0
POLICY = {
    "default_tier": "free",
    "tiers": {"free": {"user": [{"type": "token_bucket", "capacity": 10, "per_second": 1}]}},
}
DENIED = Decision(False, 1.0, "user: token_bucket(10, 1/s)", RATE_LIMITED, 0.0)


def setting_up(url: str, clock: ManualClock) -> DenialStats:
    call_command("migrate", verbosity=0)
    load_policy(POLICY)
    nowhere = f"http://127.0.0.1:{free_port()}/hook"
    for name, threshold, window in (("share-5m", 0.2, "5m"), ("share-1h", 0.5, "1h")):
        share = {"kind": "denied_share", "threshold": threshold, "window": window}
        Alert.objects.create(name=name, **share, url=nowhere, secret="s")
    Alert.objects.create(name="quota-80", kind="quota_used", threshold=0.8, url=nowhere, secret="s")
    stats = DenialStats(client=redis.Redis.from_url(url), clock=clock, flush_every=None)
    install_denial_stats(stats)
    install_policy_cache(PolicyCache(store=RedisStore(url=url), clock=clock, limiter_clock=clock))
    return stats


def traffic(stats: DenialStats, tenants: list[str]) -> None:
    for i, tenant in enumerate(tenants):
        denials = 6 if i % 10 == 0 else 1  # a tenth of them past both shares
        for j in range(12):
            keys = {"user": f"u{j % 3}", "team": tenant, "global": "*"}
            stats.record(keys, DENIED if j < denials else allowed(5.0))
    stats.flush()


def one_size(stats: DenialStats, clock: ManualClock, count: int, rounds: int) -> tuple[float, float, int]:
    tenants = [f"t{count}-{i}" for i in range(count)]
    traffic(stats, tenants)
    firsts, steadies, fired = [], [], 0
    for _ in range(rounds):
        AlertFiring.objects.all().delete()
        worker = AlertRounds(None, clock=clock, pool=JobPool("bench", workers=2, waiting=count), flusher=Flusher())
        started = time.perf_counter()
        worker.run(tenants, clock())
        firsts.append(time.perf_counter() - started)
        fired = AlertFiring.objects.count()
        for _ in range(3):
            started = time.perf_counter()
            worker.run(tenants, clock())
            steadies.append(time.perf_counter() - started)
        worker.pool.shutdown()
    return min(firsts), statistics.median(steadies), fired


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, nargs="*", default=[100, 1000, 10000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis", help="a redis:// URL to use (default: a redis-server of our own)")
    args = parser.parse_args()
    clock = ManualClock(START)
    with redis_server(args.redis) as url:
        stats = setting_up(url, clock)
        print(f"{'tenants':>8} {'fired':>6} {'first round':>12} {'steady round':>13} {'per tenant':>11}")
        for count in args.tenants:
            first, steady, fired = one_size(stats, clock, count, args.rounds)
            print(f"{count:>8} {fired:>6} {first:>11.3f}s {steady:>12.3f}s {steady / count * 1e6:>9.0f}us")


if __name__ == "__main__":
    main()
