"""Envoy's rate limit service (gRPC) under load, against its peers in the same run:

1. gRPC `ShouldRateLimit` decisions/s against `POST /api/v1/decisions` requests/s (and both
   against the same app's `GET /healthz`, run in each round too): the same
   gunicorn serves both (RLS_BIND: the gRPC service runs in its workers, as under `make run`),
   on its own redis-server, with the workload of bench/http.py (1,000 users in 50 teams, a
   3-level decision: one descriptor `{user, team, global}` for gRPC). Closed loop, the same
   number of connections for both (gRPC: one channel, so one HTTP/2 connection, per thread),
   rounds interleaved, the median round counts. Target: gRPC at least 1.0x.
2. Through a real Envoy (docs/GATEWAYS.md's configuration) at a fixed 200 requests/s (open
   loop: each request is sent at its scheduled time, its latency counted from then): the p99
   latency with the ratelimit filter, against the same Envoy configuration without it, in
   front of the same upstream, both loaded at once (each at 200/s) so that a stall of the
   machine hits both alike. Target: at most 5 ms added.

Run: .venv/bin/python bench/rls.py [--duration S] [--rounds R] [--connections N] [--workers W]
     [--rate RPS] [--envoy-duration S]
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = ROOT  # bench/http.py would shadow the stdlib's http otherwise
elif ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import argparse  # noqa: E402
import multiprocessing  # noqa: E402
import statistics  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from array import array  # noqa: E402
from functools import partial  # noqa: E402

from bench.http import (  # noqa: E402
    POLICY,
    USERS,
    Connection,
    bodies,
    http_request,
    keys_of,
    load,
    requests_for,
    usage,
)

TARGETS = {"grpc_ratio": 1.0, "added_p99_ms": 5.0}
METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
OVERALL_OK = b"\x08\x01"  # a RateLimitResponse's first field: overall_code = OK (1)


# 1. gRPC against REST ----------------------------------------------------------------------


def rls_requests() -> list:
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
    from envoy.service.ratelimit.v3 import rls_pb2

    entry = ratelimit_pb2.RateLimitDescriptor.Entry
    return [
        rls_pb2.RateLimitRequest(
            domain="limiter",
            descriptors=[
                ratelimit_pb2.RateLimitDescriptor(entries=[entry(key=k, value=v) for k, v in keys_of(user).items()])
            ],
        )
        for user in range(USERS)
    ]


def grpc_thread(port: int, token: str, start: float, t0: float, t1: float, seed: int, out: list) -> None:
    import grpc

    # Prebuilt request bytes, and the answer read as bytes: the client's share of the CPU
    # kept small, as bench/http.py's REST load generator keeps its own.
    requests = [request.SerializeToString() for request in rls_requests()]
    # A channel of its own (local subchannel pool): one HTTP/2 connection per thread, as
    # the REST load has one keep-alive connection per thread.
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
    # The service token, as Envoy sends it (LIMITER_RLS_REQUIRE_TOKEN is on by default).
    call = partial(channel.unary_unary(METHOD), metadata=(("authorization", f"Bearer {token}"),))
    call(requests[0], timeout=30, wait_for_ready=True)
    time.sleep(max(0.0, start - time.monotonic()))
    latencies, errors, allowed, i = array("d"), 0, 0, seed
    monotonic = time.monotonic
    while (sent := monotonic()) < t1:
        try:
            answer = call(requests[i % USERS], timeout=30)
        except grpc.RpcError:
            errors += 1
            continue
        done = monotonic()
        i += 7
        if t0 <= done < t1:
            latencies.append(done - sent)
            allowed += answer.startswith(OVERALL_OK)
    channel.close()
    out.append((latencies, errors, allowed))


def grpc_process(port, token, threads, start, t0, t1, seed, pipe) -> None:
    found: list = []
    workers = [
        threading.Thread(target=grpc_thread, args=(port, token, start, t0, t1, seed * 100 + k, found))
        for k in range(threads)
    ]
    for worker in workers:
        worker.start()
    time.sleep(max(0.0, t0 - time.monotonic()))
    cpu0 = time.process_time()
    time.sleep(max(0.0, t1 - time.monotonic()))
    cpu1 = time.process_time()
    for worker in workers:
        worker.join()
    pipe.send(([(list(lat), err, ok) for lat, err, ok in found], cpu1 - cpu0))
    pipe.close()


def grpc_load(port: int, token: str, args, gunicorn: list[int]) -> dict:
    """One closed-loop run of gRPC decisions: --connections threads over --client-processes."""
    context = multiprocessing.get_context("fork")  # grpc is imported in the children only
    processes = min(args.client_processes, args.connections)
    share = [args.connections // processes + (k < args.connections % processes) for k in range(processes)]
    start = time.monotonic() + 1.0
    t0, t1 = start + args.warmup, start + args.warmup + args.duration
    pipes, children = [], []
    for k, threads in enumerate(share):
        ours, theirs = context.Pipe(duplex=False)
        child = context.Process(target=grpc_process, args=(port, token, threads, start, t0, t1, k + 1, theirs))
        child.start()
        pipes.append(ours)
        children.append(child)
    time.sleep(max(0.0, t0 - time.monotonic()))
    before = usage(gunicorn)
    time.sleep(max(0.0, t1 - time.monotonic()))
    used = usage(gunicorn) - before
    results = [pipe.recv() for pipe in pipes]
    for child in children:
        child.join()
    latencies = sorted(x for found, _ in results for lat, _, _ in found for x in lat)
    if not latencies:
        raise SystemExit("no gRPC answer arrived in the measured window")
    n = len(latencies)
    return {
        "requests_s": n / args.duration,
        "p50_ms": 1e3 * latencies[int(0.5 * (n - 1))],
        "p99_ms": 1e3 * latencies[int(0.99 * (n - 1))],
        "errors": sum(err for found, _ in results for _, err, _ in found),
        "allowed": sum(ok for found, _ in results for _, _, ok in found) / n,
        "client_cpu_us": 1e6 * sum(cpu for _, cpu in results) / n,
        "server_cpu_us": 1e6 * (used.user + used.system) / n,
    }


# 2. Through Envoy, with and without the filter ------------------------------------------------


def serve_upstream(port_pipe) -> None:
    from tests.envoy.gateway import Upstream

    upstream = Upstream()
    port_pipe.send(upstream.port)
    upstream.server.serve_forever()


def envoy_config_without_filter(text: str) -> str:
    """The documented configuration with its ratelimit filter taken out (the peer)."""
    import yaml

    config = yaml.safe_load(text)
    for listener in config["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for network_filter in chain["filters"]:
                filters = network_filter["typed_config"]["http_filters"]
                filters[:] = [f for f in filters if f["name"] != "envoy.filters.http.ratelimit"]
    return yaml.safe_dump(config)


def api_key(team: str) -> str:
    return f"key-of-{team}"


def callers() -> dict:
    """The API keys Envoy knows: one for each team of bench/http.py's users."""
    from tests.envoy.gateway import Caller

    teams = {keys_of(user)["team"] for user in range(USERS)}
    return {team: Caller(api_key(team), team, "") for team in sorted(teams)}


def paced(port: int, rate: float, duration: float, senders: int) -> dict:
    """Open loop: request j is due at start + j / rate, sent by thread j % senders on its own
    keep-alive connection; its latency counts from when it was due."""
    start = time.monotonic() + 0.5
    total = int(rate * duration)
    found: list = []

    def sender(k: int) -> None:
        connection = Connection(port)
        connection.open()
        latencies, errors = array("d"), 0
        for j in range(k, total, senders):
            due = start + j / rate
            time.sleep(max(0.0, due - time.monotonic()))
            team = keys_of((j * 7) % USERS)["team"]
            # The documented configuration knows a client by its API key, which names its team.
            request = f"GET /work HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: {api_key(team)}\r\n\r\n".encode()
            try:
                status, _ = connection.exchange(request)
            except (ConnectionError, OSError):
                errors += 1
                connection.open()
                continue
            latencies.append(time.monotonic() - due)
            errors += status != 200
        connection.sock.close()
        found.append((latencies, errors))

    threads = [threading.Thread(target=sender, args=(k,)) for k in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    latencies = sorted(x for lat, _ in found for x in lat)
    n = len(latencies)
    return {
        "n": n,
        "p50_ms": 1e3 * latencies[int(0.5 * (n - 1))],
        "p99_ms": 1e3 * latencies[int(0.99 * (n - 1))],
        "errors": sum(err for _, err in found),
    }


def measure(found: dict, name: str, port: int, args) -> None:
    found[name] = paced(port, args.rate, args.envoy_duration, args.senders)


def through_envoy(service, rls_port: int, args) -> list[dict]:
    from tests.envoy.gateway import Envoy

    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe(duplex=False)
    upstream = context.Process(target=serve_upstream, args=(theirs,), daemon=True)
    upstream.start()
    upstream_port = ours.recv()
    with_filter = Envoy(rls_port, upstream_port, token=service.token, callers=callers())
    without = Envoy(rls_port, upstream_port, token=service.token, edit=envoy_config_without_filter, callers=callers())
    rounds = []
    try:
        with with_filter, without:
            for envoy in (with_filter, without):  # warm-up: connections, the policy, the token
                paced(envoy.port, args.rate, 2.0, args.senders)
            for number in range(1, args.rounds + 1):
                # Both at once, each at --rate: a stall of the shared machine hits both alike.
                found: dict = {}
                runs = [
                    threading.Thread(target=measure, args=(found, name, envoy.port, args))
                    for name, envoy in (("with", with_filter), ("without", without))
                ]
                for run in runs:
                    run.start()
                for run in runs:
                    run.join()
                found["added_p99_ms"] = found["with"]["p99_ms"] - found["without"]["p99_ms"]
                print(
                    f"{number:>5} envoy {args.rate:.0f}/s: with the filter p50 {found['with']['p50_ms']:.2f} ms, "
                    f"p99 {found['with']['p99_ms']:.2f} ms ({found['with']['errors']} errors); without "
                    f"p50 {found['without']['p50_ms']:.2f} ms, p99 {found['without']['p99_ms']:.2f} ms "
                    f"({found['without']['errors']} errors); p99 added {found['added_p99_ms']:+.2f} ms; "
                    f"load average {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
                rounds.append(found)
    finally:
        upstream.terminate()
        upstream.join()
    return rounds


# The run -----------------------------------------------------------------------------------------


def bench(args) -> None:
    from bench.redis_store import redis_server
    from tests.serving import Service, free_port

    rls_port = free_port()
    with (
        redis_server(None) as url,
        Service(
            POLICY,
            redis_url=url,
            workers=args.workers,
            threads=args.threads,
            extra_env={"DJANGO_SETTINGS_MODULE": "bench.settings", "RLS_BIND": f"127.0.0.1:{rls_port}"},
        ) as service,
    ):
        port, token = service.port, service.token
        rest = [http_request("/api/v1/decisions", body, port, token) for body in bodies("decision", 1)]
        healthz = requests_for("healthz", port, token, 1)
        servers = {"gunicorn": [service.process.pid, *service.worker_pids()], "redis-server": []}
        print(f"gRPC vs REST: {args.workers} gunicorn workers x {args.threads} threads, {args.connections} connections")
        rounds = []
        for number in range(1, args.rounds + 1 if "grpc" in args.parts else 1):
            found = {
                "healthz": load(port, healthz, 0, args, servers),
                "rest": load(port, rest, 1, args, servers),
                "grpc": grpc_load(rls_port, token, args, servers["gunicorn"]),
            }
            found["ratio"] = found["grpc"]["requests_s"] / found["rest"]["requests_s"]
            found["of_healthz"] = found["grpc"]["requests_s"] / found["healthz"]["requests_s"]
            print(
                f"{number:>5} REST {found['rest']['requests_s']:7,.0f}/s (p99 {found['rest']['p99_ms']:.2f} ms, "
                f"{found['rest']['errors']} errors, {found['rest']['allowed']:.0%} allowed) | gRPC "
                f"{found['grpc']['requests_s']:7,.0f}/s (p99 {found['grpc']['p99_ms']:.2f} ms, "
                f"{found['grpc']['errors']} errors, {found['grpc']['allowed']:.0%} allowed) | "
                f"ratio {found['ratio']:.2f} | /healthz {found['healthz']['requests_s']:7,.0f}/s, gRPC of it "
                f"{found['of_healthz']:.2f} | gunicorn CPU us per decision: REST "
                f"{found['rest']['cpu_us']['gunicorn']:,.0f}, gRPC {found['grpc']['server_cpu_us']:,.0f}; "
                f"load generator: REST {found['rest']['cpu_us']['load generator']:,.0f}, gRPC "
                f"{found['grpc']['client_cpu_us']:,.0f} | load average {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            rounds.append(found)
        envoy_rounds = through_envoy(service, rls_port, args) if "envoy" in args.parts else []
    print()
    if rounds:
        report_grpc(rounds)
    if envoy_rounds:
        report_envoy(envoy_rounds, args)


def report_grpc(rounds: list[dict]) -> None:
    ratio = statistics.median(r["ratio"] for r in rounds)
    rest = statistics.median(r["rest"]["cpu_us"]["gunicorn"] for r in rounds)
    grpc_cpu = statistics.median(r["grpc"]["server_cpu_us"] for r in rounds)
    print(f"gunicorn CPU per decision, median: REST {rest:,.0f} us, gRPC {grpc_cpu:,.0f} us")
    of_healthz = statistics.median(r["of_healthz"] for r in rounds)
    rest_of = statistics.median(r["rest"]["requests_s"] / r["healthz"]["requests_s"] for r in rounds)
    print(
        f"against /healthz requests/s in the same round, median: gRPC {of_healthz:.2f}x, REST /decisions "
        f"{rest_of:.2f}x; gunicorn CPU per /healthz request "
        f"{statistics.median(r['healthz']['cpu_us']['gunicorn'] for r in rounds):,.0f} us"
    )
    print(
        f"gRPC decisions/s over /decisions requests/s, median of {len(rounds)} rounds: {ratio:.2f}x "
        f"(target >= {TARGETS['grpc_ratio']:.1f}x): {'met' if ratio >= TARGETS['grpc_ratio'] else 'NOT met'}"
    )


def report_envoy(envoy_rounds: list[dict], args) -> None:
    added = statistics.median(r["added_p99_ms"] for r in envoy_rounds)
    p50 = statistics.median(r["with"]["p50_ms"] - r["without"]["p50_ms"] for r in envoy_rounds)
    print(f"p50 latency the filter adds, median: {p50:+.2f} ms")
    print(
        f"p99 latency the ratelimit filter adds through Envoy at {args.rate:.0f} requests/s, median of "
        f"{len(envoy_rounds)} rounds: {added:+.2f} ms (target <= {TARGETS['added_p99_ms']:.0f} ms): "
        f"{'met' if added <= TARGETS['added_p99_ms'] else 'NOT met'}"
    )


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds per closed-loop run")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rate", type=float, default=200.0, help="requests/s through Envoy")
    parser.add_argument("--envoy-duration", type=float, default=15.0, help="seconds per paced Envoy run")
    parser.add_argument("--senders", type=int, default=8, help="connections of each paced Envoy load")
    parser.add_argument("--parts", default="grpc,envoy", help="which comparisons to run: grpc, envoy or both")
    return parser.parse_args()


if __name__ == "__main__":
    bench(parse_args())
