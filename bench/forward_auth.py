"""Forward-auth and decisions against the app's own /healthz, end to end: requests per second
of the real service (gunicorn, one fresh SQLite database, its own redis-server), each endpoint
measured side by side with its peer in the same run, in interleaved rounds:

- healthz: `GET /healthz`, the app's liveness probe: Django, the middleware and gunicorn,
  no authentication, no decision: the peer;
- decision: `POST /api/v1/decisions`, Bearer token, a 3-level decision on Redis;
- authz: `GET /api/v1/authz` with `X-Limiter-User` and `X-Limiter-Team`, Bearer token, the
  same decision, answered by status (forward-auth, as nginx's auth_request asks).

Run: .venv/bin/python bench/forward_auth.py [--duration S] [--connections N] [--workers W]
     [--threads T] [--rounds R] [--endpoints healthz,decision,authz] [--worker-class granian]
     [--rate 500,1000,2000 [--open-rounds K]]

`--rate`: after the closed loop (`--rounds 0`: none), open-loop runs at each rate, as
bench/http.py's: requests due at fixed times whatever the answers, each latency counted from
when it was due, and what authz and the decision add to /healthz's p50 and p99 at that rate.

The load generator, the policy (1,000 users in 50 teams, limits out of reach), the service and
the CPU accounting are bench/http.py's. The MEDIAN round counts; every round is printed.
"""

from __future__ import annotations

import os
import sys

# As bench/http.py: this directory must not shadow the standard library's `http`.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = ROOT
elif ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import types  # noqa: E402

from bench.http import (  # noqa: E402
    AS_CONFIGURED,
    HEADER,
    PATIENT,
    USERS,
    WORKER_CLASSES,
    Connection,
    keys_of,
    load,
    machine_us,
    parse_rates,
    print_run,
    report_open,
    serve,
    spread,
    verdict,
)

PEER = "healthz"
# What each endpoint must make of the peer's requests/s (authz: at least 0.7x; decision: not
# below the ratio measured before the gateway request path, docs/BENCHMARKS.md).
TARGETS = {"authz": 0.7}


def requests_for(endpoint: str, port: int, token: str) -> list[bytes]:
    """Prebuilt request bytes: one per user (healthz: one)."""
    host = f"Host: 127.0.0.1:{port}\r\n"
    auth = f"Authorization: Bearer {token}\r\n"
    if endpoint == "healthz":
        return [f"GET /healthz HTTP/1.1\r\n{host}\r\n".encode()]
    if endpoint == "authz":
        return [
            (
                f"GET /api/v1/authz HTTP/1.1\r\n{host}{auth}X-Limiter-User: {keys['user']}\r\n"
                f"X-Limiter-Team: {keys['team']}\r\n\r\n"
            ).encode()
            for keys in map(keys_of, range(USERS))
        ]
    bodies = [json.dumps({"keys": keys_of(user)}).encode() for user in range(USERS)]
    return [
        (
            f"POST /api/v1/decisions HTTP/1.1\r\n{host}{auth}Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body
        for body in bodies
    ]


def bench(args) -> None:
    from bench.redis_store import redis_server
    from core.stores.redis import connect

    rounds: list[dict] = []
    with redis_server(None) as url, serve(args, url, worker_class=args.worker_class) as service:
        port, token = service.port, service.token
        work = {endpoint: requests_for(endpoint, port, token) for endpoint in args.endpoints}
        for endpoint, requests in work.items():
            status, body = Connection(port).exchange_once(requests[0])
            if status != 200:
                raise SystemExit(f"{endpoint}: {status} {body[:300]!r}\n{service.read_log()}")
        redis = connect(url, PATIENT)
        redis_pid = int(redis.info("server")["process_id"])
        servers = {"gunicorn": [service.process.pid, *service.worker_pids()], "redis-server": [redis_pid]}
        print(HEADER)
        # As bench/http.py's rounds: the closed loop, then each --rate, open.
        ours = types.SimpleNamespace(label="ours", endpoints=args.endpoints)
        open_loop: dict[float, list[dict]] = {rate: [] for rate in args.rate}
        for rate in ([None] if args.rounds else []) + args.rate:
            for number in range(1, (args.rounds if rate is None else args.open_rounds) + 1):
                found = {}
                for endpoint, requests in work.items():
                    found[endpoint] = load(port, requests, 1, args, servers, rate=rate, redis=redis)
                    print_run(number, endpoint, found[endpoint])
                if rate is None:
                    rounds.append(found)
                else:
                    open_loop[rate].append({ours.label: found})
    if rounds:
        report(rounds, args)
    if args.rate:
        report_open(open_loop, [ours], args)


def report(rounds: list[dict], args) -> None:
    print(
        f"\nmedian of {len(rounds)} interleaved rounds; {args.connections} connections; {args.worker_class}, "
        f"-w {args.workers} --threads {args.threads}; {args.duration:g} s per run after {args.warmup:g} s "
        f"warm-up; Python {sys.version.split()[0]}, {os.cpu_count()} cores"
    )
    for endpoint in args.endpoints:
        print(
            f"{endpoint:9} {statistics.median(r[endpoint]['requests_s'] for r in rounds):8,.0f} req/s, "
            f"p99 {statistics.median(r[endpoint]['p99_ms'] for r in rounds):6.2f} ms, errors "
            f"{sum(r[endpoint]['errors'] for r in rounds)}, degraded "
            f"{max(r[endpoint]['degraded'] for r in rounds):.1%}"
        )
    for endpoint in args.endpoints:
        if endpoint == PEER or PEER not in args.endpoints:
            continue
        per_round = [r[endpoint]["requests_s"] / r[PEER]["requests_s"] for r in rounds]
        cpu = [machine_us(r[PEER]) / machine_us(r[endpoint]) for r in rounds]
        ratio = statistics.median(per_round)
        target = TARGETS.get(endpoint)
        wanted = f"; target >= {target}x: {verdict(ratio >= target)}" if target else ""
        print(
            f"{endpoint} / {PEER} requests/s: {ratio:.2f}x median (rounds {spread(per_round)}){wanted}. "
            f"By CPU per request of the whole machine: {statistics.median(cpu):.2f}x (rounds {spread(cpu)})"
        )


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring")
    parser.add_argument("--connections", type=int, default=16, help="keep-alive connections in all")
    parser.add_argument("--client-processes", type=int, default=2, help="load generator processes")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn -w")
    parser.add_argument("--threads", type=int, default=8, help="gunicorn --threads")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the median counts")
    parser.add_argument("--endpoints", default="healthz,decision,authz", help="comma-separated, in round order")
    parser.add_argument(
        "--worker-class",
        default=AS_CONFIGURED,
        choices=[AS_CONFIGURED, *WORKER_CLASSES],
        help="as bench/http.py's (granian: the gateways' pool of `make run` with Redis)",
    )
    parser.add_argument(
        "--client", choices=("python", "wrk"), default="python", help="the closed loop's, as bench/http.py's"
    )
    parser.add_argument("--rate", default="", help="open loop: comma-separated requests/s, after the closed loop")
    parser.add_argument("--open-rounds", type=int, default=3, help="rounds at each --rate")
    args = parser.parse_args()
    args.endpoints = [e.strip() for e in args.endpoints.split(",") if e.strip()]
    unknown = set(args.endpoints) - {"healthz", "decision", "authz"}
    if unknown:
        parser.error(f"unknown endpoints {sorted(unknown)}")
    args.rate = parse_rates(parser, args.rate)
    if args.rounds < 0 or args.open_rounds < 1:
        parser.error("--rounds must be at least 0 and --open-rounds at least 1")
    if not args.rounds and not args.rate:
        parser.error("nothing to run: --rounds 0 and no --rate")
    return args


if __name__ == "__main__":
    bench(parse_args())
