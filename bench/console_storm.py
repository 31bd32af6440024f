"""Decision latency while the console is stormed: what a gateway waits for a decision while
strangers post the admin's login form (a fresh username each time, so no lockout applies) and
while operators ask for what-if replays over a large record.

The service is served as `make run` serves it with REDIS_URL (4 gunicorn workers of 8 threads
by default, its own redis-server, a fresh SQLite database), with --records recorded decisions
in its stream. A paced open-loop load (tests/reliability/load.py: request i is sent at i /
rate whatever the answers before took, so a slow answer does not hide the ones behind it)
asks --rate decisions a second for --duration seconds: once quiet, once during a login storm
of --login-clients, once during a what-if storm of --whatif-clients. It prints p50, p95, p99
and the longest decision, and what the storms got.

Run: .venv/bin/python bench/console_storm.py [--against CHECKOUT] [--rate 200] [--duration 15]
     [--login-clients 40] [--whatif-clients 8] [--records 200000] [--workers 4] [--threads 8]

With --against, the same runs are made against the service of another checkout (its own
tree served by gunicorn, e.g. a `git worktree` of an older commit), one after the other.
With --pools, the gateways' decisions go to a pool of workers of their own
(LIMITER_CONSOLE_CONCURRENCY=0, --workers of them) and the storms to the console's pool
(--console-workers, at LIMITER_WORKER_NICE=10), as docs/OPERATIONS.md runs them.
"""

from __future__ import annotations

import os
import sys

# bench/ holds a module named http.py: it must not stand before the standard library's `http`.
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
from pathlib import Path  # noqa: E402

import redis  # noqa: E402

from bench.redis_store import redis_server  # noqa: E402
from tests.reliability.load import Load, percentile  # noqa: E402
from tests.reliability.storms import LoginStorm, WhatIfStorm, fill_record  # noqa: E402
from tests.serving import ROOT, Service  # noqa: E402

POLICY = {
    "default_tier": "free",
    "levels": [{"name": "user"}, {"name": "team"}, {"name": "global"}],
    "tiers": {
        "free": {
            "user": [{"type": "token_bucket", "capacity": 1000, "per_second": 100}],
            "team": [{"type": "token_bucket", "capacity": 10000, "per_second": 1000}],
        }
    },
    "global": [{"type": "token_bucket", "capacity": 100000, "per_second": 10000}],
}


def decisions(service, args) -> list:
    def ask(i: int) -> tuple[str, dict]:
        return "/api/v1/decisions", {"keys": {"user": f"u{i % 500}", "team": f"t{i % 50}", "global": "*"}}

    return Load(service, ask, rate=args.rate, duration=args.duration, clients=16).run()


def summary(name: str, answers: list, storm=None) -> str:
    took = [a.took * 1000 for a in answers if a.status == 200]
    failed = sum(a.status != 200 for a in answers)
    line = (
        f"{name:<16} p50 {percentile(took, 50):7.1f} ms  p95 {percentile(took, 95):7.1f} ms  "
        f"p99 {percentile(took, 99):7.1f} ms  max {max(took, default=0):8.1f} ms  not 200: {failed}"
    )
    if storm is not None:
        line += f"  | storm answers {dict(sorted(storm.statuses.items(), key=str))}"
    return line


def run(tree: Path, args) -> None:
    shape = f"{args.workers} workers x {args.threads} threads"
    if args.pools:
        shape = f"gateways' pool: {shape}; console's pool: {args.console_workers} workers at nice 10"
    print(f"\n{tree}: {shape}; {args.rate}/s for {args.duration} s each")
    with redis_server(None) as url:
        extra = {"LIMITER_RECORD_LIMIT": str(args.records + 10_000), "LIMITER_STORE_TIMEOUT": "1.0"}
        console_workers = args.console_workers if args.pools else args.workers
        if args.pools:
            extra["LIMITER_WORKER_NICE"] = "10"
        service = Service(
            POLICY,
            redis_url=url,
            workers=console_workers,
            threads=args.threads,
            scope="admin",
            root=tree,
            extra_env=extra,
        )
        with service:
            gateways = service
            if args.pools:
                only = {"LIMITER_CONSOLE_CONCURRENCY": "0", "LIMITER_WORKER_NICE": "0"}
                gateways = service.sibling(workers=args.workers, threads=args.threads, extra_env=only)
            try:
                fill_record(redis.Redis.from_url(url), args.records)
                decisions(gateways, argparse.Namespace(**{**vars(args), "duration": 2}))  # warm-up
                print(summary("quiet", decisions(gateways, args)), flush=True)
                with LoginStorm(service, args.login_clients) as storm:
                    print(summary("login storm", decisions(gateways, args), storm), flush=True)
                with WhatIfStorm(service, args.whatif_clients) as storm:
                    print(summary("what-if storm", decisions(gateways, args), storm), flush=True)
            finally:
                if gateways is not service:
                    gateways.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", type=Path, help="another checkout, served the same way after this one")
    parser.add_argument("--rate", type=float, default=200.0, help="decisions a second")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per run")
    parser.add_argument("--login-clients", type=int, default=40)
    parser.add_argument("--whatif-clients", type=int, default=8)
    parser.add_argument("--records", type=int, default=200_000, help="recorded decisions to replay")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--pools", action="store_true", help="the gateways' own pool beside the console's")
    parser.add_argument("--console-workers", type=int, default=2, help="with --pools: the console's workers")
    args = parser.parse_args()
    run(ROOT, args)
    if args.against:
        run(args.against.resolve(), args)


if __name__ == "__main__":
    main()
