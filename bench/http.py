"""The HTTP API under load, end to end: requests per second and latency of the real service
(gunicorn, `-c python:limiter_admin.gunicorn_conf`, one fresh SQLite database, its own
redis-server), for three endpoints served by one gunicorn, side by side:

- bare: `POST /bench/bare`, a DRF APIView that answers a constant (no authentication, no
  permission check, the body not read), served from bench/settings.py + bench/urls.py
  (the app's URLs plus this one): the floor of Django + DRF + gunicorn;
- decision: `POST /api/v1/decisions`, Bearer token, a 3-level decision on Redis;
- batch: `POST /api/v1/decisions/batch` with --batch-size decisions per request.

Run: .venv/bin/python bench/http.py [--duration S] [--connections N] [--workers W]
     [--threads T] [--batch-size B] [--rounds R] [--profile auto|always|never]

Load: --client-processes processes (fork), each with threads that hold one keep-alive
HTTP/1.1 connection to 127.0.0.1 each, --connections in all, every connection sending its
next request as soon as the answer is in (closed loop). The client writes prebuilt request
bytes on a plain socket and reads the answer by its Content-Length: 40 - 60 us of CPU per
request, where http.client took about 160 us (gunicorn serving the bare view: about 550 us).
The client shares the machine's cores with the server, so a heavier client would take cores
from the server and hide part of the server's own differences. Each run
warms up for --warmup seconds, then counts the answers that arrive within --duration
seconds: requests/s, and each request's latency (send to last byte) for p50 and p99.

The rounds are interleaved (bare, decision, batch; bare, decision, batch; ...) and the
MEDIAN round counts; every round is printed, so the noise is visible. CPU per request of
the gunicorn processes, redis-server and the load generator comes from /proc over each
measured window: they all share the same cores.

Decisions that come back `degraded` (Redis did not answer within LIMITER_STORE_TIMEOUT, or the
breaker was open: the fail mode decided) are counted; rounds with any are left out of the ratios.

When the decision endpoint makes less than 0.8x the bare view's requests/s (or with
--profile always), a fresh process then calls the Django WSGI handler directly, with the same
settings, database and Redis and no gunicorn. It times whole requests, then a decision with one
step of the view stubbed out at a time (the saving is that step's cost in place), then runs
cProfile over decisions.
"""

from __future__ import annotations

import os
import sys

# This file is named http.py: run as a script, its own directory would come first on
# sys.path and `import http.client` (the stdlib's, used by Django and our Service) would find
# it. The repository root takes that place instead, before anything imports `http`.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = ROOT
elif ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import random  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from array import array  # noqa: E402
from typing import NamedTuple  # noqa: E402

USERS, TEAMS = 1000, 50
LIMITS = {"user": (100, 50), "team": (2000, 1000), "global": (1_000_000, 100_000)}
POLICY = {
    "default_tier": "bench",
    "levels": [{"name": level} for level in LIMITS],
    "tiers": {
        "bench": {level: [{"type": "token_bucket", "capacity": c, "per_second": r}] for level, (c, r) in LIMITS.items()}
    },
}
PATHS = {
    "bare": "/bench/bare",
    "decision": "/api/v1/decisions",
    "batch": "/api/v1/decisions/batch",
}
ALLOWED = b'"allowed":true'
# A degraded decision never reached Redis: the store timed out (LIMITER_STORE_TIMEOUT) or its
# breaker was open, and the level's fail mode decided. Counted, and flagged in the report.
DEGRADED = b'"degraded":true'
TARGETS = {"ratio": 0.8, "p99_ms": 20.0, "p99_connections": 16, "batch": 10.0}
CLOCK_TICK = os.sysconf("SC_CLK_TCK")


# The workload ------------------------------------------------------------------------------


def keys_of(user: int) -> dict:
    """1,000 users in 50 teams and one global key: the mix of bench/engine.py."""
    return {"user": f"user-{user}", "team": f"team-{user % TEAMS}", "global": "*"}


def bodies(endpoint: str, batch_size: int, seed: int = 7) -> list[bytes]:
    """JSON bodies: one decision per user (bare and decision: the same bodies), or batches of
    `batch_size` decisions on users drawn at random."""
    if endpoint != "batch":
        return [json.dumps({"keys": keys_of(user)}).encode() for user in range(USERS)]
    rng = random.Random(seed)
    return [
        json.dumps({"requests": [{"keys": keys_of(rng.randrange(USERS))} for _ in range(batch_size)]}).encode()
        for _ in range(200)
    ]


def http_request(path: str, body: bytes, port: int, token: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


# The load generator ------------------------------------------------------------------------


class Connection:
    """One keep-alive HTTP/1.1 connection: send prebuilt request bytes, read one answer."""

    def __init__(self, port: int) -> None:
        self.port, self.sock, self.opened = port, None, 0

    def open(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.opened += 1

    def exchange(self, request: bytes) -> tuple[int, bytes]:
        """(status, body); raises ConnectionError when the server closed the connection."""
        sock = self.sock
        sock.sendall(request)
        data = sock.recv(65536)
        while (end := data.find(b"\r\n\r\n")) < 0:
            data += self._more()
        head = data[:end].lower()
        length = content_length(head)
        body = data[end + 4 :]
        while len(body) < length:
            body += self._more()
        if b"\r\nconnection: close" in head:
            self.open()
        return int(head[9:12]), body

    def exchange_once(self, request: bytes) -> tuple[int, bytes]:
        """One request on a connection of its own."""
        self.open()
        try:
            return self.exchange(request)
        finally:
            self.sock.close()

    def _more(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        return chunk


def content_length(head: bytes) -> int:
    """Content-Length of a lower-cased response head (our endpoints always send one)."""
    at = head.find(b"\r\ncontent-length:")
    if at < 0:
        raise ValueError(f"an answer without Content-Length: {head[:200]!r}")
    end = head.find(b"\r\n", at + 2)
    return int(head[at + 17 : end if end > 0 else None])


class Tally(NamedTuple):
    """What one thread saw inside the measured window."""

    latencies: array  # seconds, one per answer that arrived in the window
    errors: int  # answers other than 200, and lost connections
    decisions: int
    allowed: int
    degraded: int
    reconnects: int


def drive(port: int, requests: list[bytes], per_request: int, start: float, t0: float, t1: float, seed: int) -> Tally:
    """Send `requests` in a shuffled cycle from `start` until `t1`; count answers in [t0, t1)."""
    order = list(range(len(requests)))
    random.Random(seed).shuffle(order)
    requests = [requests[i] for i in order]
    connection = Connection(port)
    connection.open()
    time.sleep(max(0.0, start - time.monotonic()))
    latencies, errors, allowed, degraded, i, n = array("d"), 0, 0, 0, 0, len(requests)
    monotonic = time.monotonic
    while (sent := monotonic()) < t1:
        try:
            status, body = connection.exchange(requests[i % n])
        except (ConnectionError, OSError):
            errors += monotonic() >= t0
            connection.open()
            continue
        done = monotonic()
        i += 1
        if t0 <= done < t1:
            latencies.append(done - sent)
            if status != 200:
                errors += 1
            allowed += body.count(ALLOWED) if per_request > 1 else body.startswith(b"{" + ALLOWED)
            degraded += body.count(DEGRADED)
    connection.sock.close()
    return Tally(latencies, errors, len(latencies) * per_request, allowed, degraded, connection.opened - 1)


def client_process(port, requests, per_request, threads, start, t0, t1, seed, pipe) -> None:
    """One load process: `threads` connections; sends its tallies and its CPU time back."""
    tallies: list[Tally] = []
    failures: list[str] = []

    def run(k: int) -> None:
        try:
            tallies.append(drive(port, requests, per_request, start, t0, t1, seed * 1000 + k))
        except Exception as error:  # reported by the parent: a lost thread would skew the counts
            failures.append(repr(error))

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for worker in workers:
        worker.start()
    time.sleep(max(0.0, t0 - time.monotonic()))
    cpu0 = time.process_time()
    time.sleep(max(0.0, t1 - time.monotonic()))
    cpu1 = time.process_time()
    for worker in workers:
        worker.join()
    pipe.send((tallies, cpu1 - cpu0, failures))
    pipe.close()


class Usage(NamedTuple):
    """CPU seconds, user and system, and context switches of some processes so far."""

    user: float
    system: float
    switches: int

    def __sub__(self, other: Usage) -> Usage:
        return Usage(self.user - other.user, self.system - other.system, self.switches - other.switches)


def usage(pids: list[int]) -> Usage:
    user = system = switches = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            user, system = user + int(fields[11]), system + int(fields[12])
            for task in os.listdir(f"/proc/{pid}/task"):  # every thread's switches
                with open(f"/proc/{pid}/task/{task}/status") as status:
                    switches += sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread or process that ended meanwhile
    return Usage(user / CLOCK_TICK, system / CLOCK_TICK, switches)


def machine_idle() -> float:
    """Idle CPU seconds of the whole machine so far (all cores)."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()
    return (int(fields[4]) + int(fields[5])) / CLOCK_TICK


def load(port: int, requests: list[bytes], per_request: int, args, servers: dict[str, list[int]]) -> dict:
    """One run: --connections connections for --warmup + --duration seconds."""
    context = multiprocessing.get_context("fork")
    processes = min(args.client_processes, args.connections)
    share = [args.connections // processes + (k < args.connections % processes) for k in range(processes)]
    start = time.monotonic() + 0.5  # time to fork and connect
    t0, t1 = start + args.warmup, start + args.warmup + args.duration
    pipes, children = [], []
    for k, threads in enumerate(share):
        ours, theirs = context.Pipe(duplex=False)
        child = context.Process(
            target=client_process, args=(port, requests, per_request, threads, start, t0, t1, k + 1, theirs)
        )
        child.start()
        pipes.append(ours)
        children.append(child)
    time.sleep(max(0.0, t0 - time.monotonic()))
    before = {name: usage(pids) for name, pids in servers.items()}
    idle0 = machine_idle()
    time.sleep(max(0.0, t1 - time.monotonic()))
    used = {name: usage(pids) - before[name] for name, pids in servers.items()}
    idle = machine_idle() - idle0
    results = [pipe.recv() for pipe in pipes]
    for child in children:
        child.join()
    failures = [failure for _, _, process_failures in results for failure in process_failures]
    if failures:
        raise SystemExit(f"{len(failures)} load threads failed: {failures[0]}")
    return summarise([(tallies, cpu) for tallies, cpu, _ in results], used, idle, per_request, args)


def summarise(results, used: dict[str, Usage], idle: float, per_request: int, args) -> dict:
    tallies = [tally for process_tallies, _ in results for tally in process_tallies]
    latencies = sorted(x for tally in tallies for x in tally.latencies)
    answers = len(latencies)
    if not answers:
        raise SystemExit("no answer arrived in the measured window")
    decisions = sum(tally.decisions for tally in tallies)
    found = {
        "requests_s": answers / args.duration,
        "decisions_s": decisions / args.duration,
        "p50_ms": 1e3 * latencies[int(0.50 * (answers - 1))],
        "p99_ms": 1e3 * latencies[int(0.99 * (answers - 1))],
        "max_ms": 1e3 * latencies[-1],
        "allowed": sum(tally.allowed for tally in tallies) / decisions,
        "degraded": sum(tally.degraded for tally in tallies) / decisions,
        "errors": sum(tally.errors for tally in tallies),
        "reconnects": sum(tally.reconnects for tally in tallies),
        "cpu_us": {name: 1e6 * (u.user + u.system) / answers for name, u in used.items()},
        "gunicorn_system": used["gunicorn"].system / ((used["gunicorn"].user + used["gunicorn"].system) or 1),
        "switches": used["gunicorn"].switches / answers,
        "idle": idle / (os.cpu_count() * args.duration),
    }
    client = sum(cpu for _, cpu in results)
    found["cpu_us"]["load generator"] = 1e6 * client / answers
    # Whatever else ran meanwhile (other people's jobs on a shared machine): busy time that
    # none of our processes accounts for, in cores.
    busy = os.cpu_count() * args.duration - idle
    ours = sum(u.user + u.system for u in used.values()) + client
    found["other_cores"] = max(0.0, busy - ours) / args.duration
    return found


# The service -------------------------------------------------------------------------------


def serve(args, url: str):
    from tests.serving import Service

    return Service(
        POLICY,
        redis_url=url,
        workers=args.workers,
        threads=args.threads,
        extra_env={"DJANGO_SETTINGS_MODULE": "bench.settings"},
    )


def check_endpoints(service, port: int, token: str, batch_size: int) -> None:
    """Each endpoint answers its first request as expected, before any load."""
    for endpoint in PATHS:
        body = bodies(endpoint, batch_size)[0]
        status, answer = Connection(port).exchange_once(http_request(PATHS[endpoint], body, port, token))
        if status != 200 or ALLOWED not in answer:
            raise SystemExit(f"{endpoint}: {status} {answer[:300]!r}\n{service.read_log()}")


def bench(args) -> None:
    from bench.redis_store import redis_server
    from core.stores.redis import connect

    rounds: list[dict] = []
    with redis_server(None) as url, serve(args, url) as service:
        port, token = service.port, service.token
        check_endpoints(service, port, token, args.batch_size)
        redis_pid = int(connect(url).info("server")["process_id"])
        servers = {"gunicorn": [service.process.pid, *service.worker_pids()], "redis-server": [redis_pid]}
        work = {
            endpoint: (
                [http_request(PATHS[endpoint], body, port, token) for body in bodies(endpoint, args.batch_size)],
                args.batch_size if endpoint == "batch" else 1,
            )
            for endpoint in args.endpoints
        }
        print(HEADER)
        for number in range(1, args.rounds + 1):
            found = {}
            for endpoint, (requests, per_request) in work.items():
                found[endpoint] = load(port, requests, per_request, args, servers)
                print_run(number, endpoint, found[endpoint])
            rounds.append(found)
        report(rounds, args)
        if want_profile(args, rounds):
            profile_in_child(service, url, args)


# Reporting ---------------------------------------------------------------------------------

HEADER = (
    f"{'round':>5} {'endpoint':9} {'req/s':>8} {'decisions/s':>12} {'p50 ms':>7} {'p99 ms':>7} "
    f"{'max ms':>7} {'allowed':>8} {'degraded':>8} {'errors':>6} | CPU us per request: gunicorn (system share, "
    f"context switches), redis-server, load generator | idle | other processes"
)


def print_run(number, endpoint: str, found: dict) -> None:
    cpu = found["cpu_us"]
    print(
        f"{number:>5} {endpoint:9} {found['requests_s']:8,.0f} {found['decisions_s']:12,.0f} "
        f"{found['p50_ms']:7.2f} {found['p99_ms']:7.2f} {found['max_ms']:7.1f} {found['allowed']:8.1%} "
        f"{found['degraded']:8.1%} "
        f"{found['errors']:6} | {cpu['gunicorn']:6,.0f} ({found['gunicorn_system']:.0%} sys, "
        f"{found['switches']:.1f} sw), {cpu['redis-server']:4,.0f}, {cpu['load generator']:3,.0f} | "
        f"{found['idle']:3.0%} | {found['other_cores']:.2f} cores",
        flush=True,
    )


def median(rounds: list[dict], endpoint: str, field: str) -> float:
    return statistics.median(found[endpoint][field] for found in rounds)


def report(rounds: list[dict], args) -> dict:
    """The median round of each endpoint, and the ratios against the targets."""
    print(
        f"\nmedian of {len(rounds)} interleaved rounds; {args.connections} connections from "
        f"{min(args.client_processes, args.connections)} load processes; gunicorn -w {args.workers} "
        f"--threads {args.threads}; batch {args.batch_size}; {args.duration:g} s per run after "
        f"{args.warmup:g} s warm-up; Python {sys.version.split()[0]}, {os.cpu_count()} cores"
    )
    print(
        "The load generator, redis-server and gunicorn share the same cores: every figure is "
        "for this whole machine, client included."
    )
    print(
        f"{'endpoint':9} {'req/s':>8} {'decisions/s':>12} {'p50 ms':>7} {'p99 ms':>7} {'allowed':>8} "
        f"{'CPU us/req: gunicorn':>21} {'all three':>10}"
    )
    for endpoint in args.endpoints:
        cpu = statistics.median(found[endpoint]["cpu_us"]["gunicorn"] for found in rounds)
        print(
            f"{endpoint:9} {median(rounds, endpoint, 'requests_s'):8,.0f} "
            f"{median(rounds, endpoint, 'decisions_s'):12,.0f} {median(rounds, endpoint, 'p50_ms'):7.2f} "
            f"{median(rounds, endpoint, 'p99_ms'):7.2f} {median(rounds, endpoint, 'allowed'):8.1%} {cpu:21,.0f} "
            f"{statistics.median(machine_us(found[endpoint]) for found in rounds):10,.0f}"
        )
    degraded = max(found[endpoint]["degraded"] for found in rounds for endpoint in args.endpoints)
    if degraded:
        print(
            f"DEGRADED decisions in some runs (up to {degraded:.1%}): Redis did not answer within "
            f"LIMITER_STORE_TIMEOUT, or the breaker was open, and the fail mode decided without it. "
            f"Those runs measure the fail-open path, not Redis: compare runs without any."
        )
    other = max(found[endpoint]["other_cores"] for found in rounds for endpoint in args.endpoints)
    if other > 0.1:
        print(
            f"Other processes used up to {other:.2f} cores during these runs: the figures above are "
            f"lower and noisier than on a quiet machine (see each run's last column)."
        )
    return ratios(rounds, args)


def ratios(rounds: list[dict], args) -> dict:
    """The targets, over the rounds in which no decision was degraded (those measure the fail
    mode, not Redis)."""
    found = {}
    if {"bare", "decision"} <= set(args.endpoints):
        clean = [r for r in rounds if not r["decision"]["degraded"]]
        if clean:
            per_round = [r["decision"]["requests_s"] / r["bare"]["requests_s"] for r in clean]
            cpu = [machine_us(r["bare"]) / machine_us(r["decision"]) for r in clean]
            found["ratio"] = statistics.median(per_round)
            print(
                f"decision / bare requests/s: {found['ratio']:.2f}x median (rounds {spread(per_round)}); "
                f"target >= {TARGETS['ratio']}x: {verdict(found['ratio'] >= TARGETS['ratio'])}. By CPU per "
                f"request of all three (what a quiet machine would give): {statistics.median(cpu):.2f}x "
                f"(rounds {spread(cpu)}){excluded(rounds, clean)}"
            )
        else:
            print("decision / bare: every round had degraded decisions; rerun on a quieter machine")
    if "decision" in args.endpoints:
        clean = [r for r in rounds if not r["decision"]["degraded"]] or rounds
        p99 = statistics.median(r["decision"]["p99_ms"] for r in clean)
        note = (
            ""
            if args.connections == TARGETS["p99_connections"]
            else f" (the target is stated at {TARGETS['p99_connections']} connections;"
            f" this run used {args.connections})"
        )
        print(
            f"decision p99: {p99:.1f} ms median (rounds {spread([r['decision']['p99_ms'] for r in clean], 'ms')})"
            f" at {args.connections} connections; target <= {TARGETS['p99_ms']:g} ms: "
            f"{verdict(p99 <= TARGETS['p99_ms'])}{note}"
        )
        found["p99_ms"] = p99
    if {"decision", "batch"} <= set(args.endpoints):
        clean = [r for r in rounds if not r["decision"]["degraded"] and not r["batch"]["degraded"]]
        if clean:
            per_round = [r["batch"]["decisions_s"] / r["decision"]["decisions_s"] for r in clean]
            cpu = [machine_us(r["decision"]) * args.batch_size / machine_us(r["batch"]) for r in clean]
            found["batch"] = statistics.median(per_round)
            print(
                f"batch / single decisions/s: {found['batch']:.1f}x median (rounds {spread(per_round)}); "
                f"target >= {TARGETS['batch']:g}x: {verdict(found['batch'] >= TARGETS['batch'])}. By CPU per "
                f"decision of all three: {statistics.median(cpu):.1f}x (rounds {spread(cpu)})"
                f"{excluded(rounds, clean)}"
            )
        else:
            print("batch / single: every round had degraded decisions; rerun on a quieter machine")
    return found


def excluded(rounds: list[dict], clean: list[dict]) -> str:
    left_out = len(rounds) - len(clean)
    return f"; {left_out} round(s) with degraded decisions left out" if left_out else ""


def machine_us(found: dict) -> float:
    """CPU us per request of gunicorn, redis-server and the load generator together."""
    return sum(found["cpu_us"].values())


def spread(values: list[float], unit: str = "x") -> str:
    return (
        f"{min(values):.2f}{unit} - {max(values):.2f}{unit}"
        if unit == "x"
        else f"{min(values):.1f} - {max(values):.1f} {unit}"
    )


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def want_profile(args, rounds: list[dict]) -> bool:
    if args.profile != "auto":
        return args.profile == "always"
    if not {"bare", "decision"} <= set(args.endpoints):
        return False
    ratio = statistics.median(r["decision"]["requests_s"] / r["bare"]["requests_s"] for r in rounds)
    return ratio < TARGETS["ratio"]


# Where a decision's time goes: in one process, no gunicorn ---------------------------------


def profile_in_child(service, url: str, args) -> None:
    """Time the pieces in a fresh process on the service's own database and Redis (so that
    Django starts with the bench settings, and Prometheus in multiprocess mode, as under
    gunicorn)."""
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as metrics:
        env = {
            **service.env,
            "REDIS_URL": url,
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "PROMETHEUS_MULTIPROC_DIR": metrics,
            "BENCH_TOKEN": service.token,
        }
        print(
            "\nWhere a decision's time goes (in one process: the Django WSGI handler called "
            "directly with the bench settings, the same database and Redis, no gunicorn, no load):",
            flush=True,
        )
        subprocess.run(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--profile-child",
                "--profile-requests",
                str(args.profile_requests),
            ],
            env=env,
            cwd=ROOT,
            check=True,
        )


def environ(path: str, body: bytes, token: str) -> dict:
    import io

    return {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "127.0.0.1:8000",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_AUTHORIZATION": f"Bearer {token}",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.url_scheme": "http",
        "wsgi.version": (1, 0),
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }


def cpu_per_call(step, n: int, first: int = 0) -> tuple[float, float]:
    """(CPU us, wall us) per call of step(i) for i in range(first, first + n)."""
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(first, first + n):
        step(i)
    return 1e6 * (time.process_time() - cpu) / n, 1e6 * (time.perf_counter() - wall) / n


def profile_child(n: int) -> None:
    """Whole requests through Django's WSGI handler, then the same with one step of the
    decision view taken out at a time (its saving is what the step costs in place), then
    cProfile by category."""
    import warnings

    import django

    warnings.filterwarnings("ignore", message="No directory at")  # whitenoise: no collectstatic here

    django.setup()
    from django.core.wsgi import get_wsgi_application

    app, token = get_wsgi_application(), os.environ["BENCH_TOKEN"]
    singles, batches = bodies("decision", 1), bodies("batch", 100)

    def call(path: str, body: bytes) -> None:
        statuses = []
        result = app(environ(path, body, token), lambda status, headers, exc_info=None: statuses.append(status))
        try:
            content = b"".join(result)
        finally:
            result.close()  # request_finished, as gunicorn does
        if not statuses[0].startswith("200"):
            raise SystemExit(f"{path}: {statuses[0]} {content[:300]!r}")

    bare = lambda i: call(PATHS["bare"], singles[i % USERS])  # noqa: E731
    decision = lambda i: call(PATHS["decision"], singles[i % USERS])  # noqa: E731
    for i in range(2 * USERS):  # every user's plan built, every lazy thing made
        bare(i), decision(i), call("/bench/plain", singles[i % USERS])
    cpu_per_call(lambda i: call(PATHS["batch"], batches[i % len(batches)]), 20)
    runs = {"bare": [], "decision": [], **ablations()}
    chunk = 200
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for cycle in range(max(3, n // chunk)):  # small interleaved chunks: the machine's drift hits all alike
        for name, patches in runs.items():
            step = bare if name == "bare" else decision
            with patched(patches):
                found[name].append(cpu_per_call(step, chunk, cycle * chunk))
    batch = cpu_per_call(lambda i: call(PATHS["batch"], batches[i % len(batches)]), max(10, n // 100))
    whole = {
        name: (statistics.median(c for c, _ in values), statistics.median(w for _, w in values))
        for name, values in found.items()
    }
    print_ablations(whole, (batch[0] / 100, batch[1] / 100), for_scale(call, singles, n))
    cprofile(decision, n)


def ablations() -> dict[str, list[tuple[object, dict]]]:
    """name -> the (object, {attribute: stand-in}) patches that take one step out of a
    decision on the lean path (GatewayView.dispatch, DecisionView.post): the view answers as
    before, minus that work. `DRF_PATH` is the same decision through DRF's own dispatch."""
    from core import HierarchicalLimiter
    from policies.api import decisions
    from policies.policy import TENANT_LEVEL

    cache = decisions.policy_cache()
    policy = cache.current()
    some_keys = keys_of(1)
    limiter = cache.limiter_for(some_keys[TENANT_LEVEL])
    fixed = limiter.acquire(some_keys)
    asked = decisions.parse_decision({"keys": some_keys}, policy)
    identity = decisions.bearer_identity(f"Bearer {os.environ['BENCH_TOKEN']}")

    class Cached:
        def current(self):
            return policy

        def limiter_for(self, team):
            return limiter

    view = decisions.DecisionView
    steps = {
        "token authentication + CanDecide": [
            (decisions, {"bearer_identity": lambda header: identity}),
            (view, {"permission_classes": ()}),
        ],
        "body: read + json.loads (read_json)": [(decisions, {"read_json": lambda request: {"keys": some_keys}})],
        "parse_decision": [(decisions, {"parse_decision": lambda data, p: asked})],
        "policy cache: current() + limiter_for()": [(decisions, {"policy_cache": Cached})],
        "limiter.acquire: plan + EVALSHA round trip": [
            (HierarchicalLimiter, {"acquire": lambda self, keys, cost=1, priority=None: fixed})
        ],
        "record: Prometheus counters + denial stats": [(decisions, {"record": lambda keys, d, cost=1: None})],
        "RateLimit headers (decision_headers)": [(decisions, {"decision_headers": lambda *a: {}})],
    }
    steps["all of the above"] = [patch for patches in steps.values() for patch in patches]
    steps[DRF_PATH] = [(decisions.GatewayView, {"_takes_lean_path": lambda self, request, kwargs: False})]
    return steps


DRF_PATH = "decision through DRF's dispatch (the lean path off)"
_MISSING = object()


@contextlib.contextmanager
def patched(patches: list[tuple[object, dict]]):
    """Set the attributes for the duration; then put back exactly what was there."""
    saved = [(target, name, vars(target).get(name, _MISSING)) for target, values in patches for name in values]
    for target, values in patches:
        for name, value in values.items():
            setattr(target, name, value)
    try:
        yield
    finally:
        for target, name, value in reversed(saved):
            if value is _MISSING:
                delattr(target, name)
            else:
                setattr(target, name, value)


def for_scale(call, singles: list[bytes], n: int) -> list[tuple[str, float, float]]:
    """Whole requests to a plain Django view (no DRF); limiter.acquire on its own (back to
    back, and between two bare requests, whose work leaves the caches cold); one EVALSHA
    round trip through redis-py and on a raw connection of the same pool."""
    from policies.compile import policy_cache
    from policies.policy import TENANT_LEVEL

    cache = policy_cache()
    limiter = cache.limiter_for(keys_of(0)[TENANT_LEVEL])
    users = [keys_of(user) for user in range(USERS)]
    acquire = lambda i: limiter.acquire(users[i % USERS])  # noqa: E731
    bare = lambda i: call(PATHS["bare"], singles[i % USERS])  # noqa: E731
    rows = [
        (
            "whole request, plain Django view (no DRF)",
            *cpu_per_call(lambda i: call("/bench/plain", singles[i % USERS]), n),
        ),
        ("limiter.acquire alone, back to back", *cpu_per_call(acquire, n)),
        ("limiter.acquire alone, between bare requests", *alone(acquire, bare, n)),
    ]
    client = getattr(cache.store, "client", None)
    if client is not None:
        sha = client.script_load("return 1")
        connection = client.connection_pool.get_connection()
        packed = connection.pack_command("EVALSHA", sha, 1, "bench:floor")

        def raw(i):
            connection.send_packed_command(packed, check_health=False)
            return connection.read_response()

        rows += [
            (
                "EVALSHA `return 1` through redis-py (client.evalsha)",
                *cpu_per_call(lambda i: client.evalsha(sha, 1, "bench:floor"), n),
            ),
            ("the same on a raw connection (send_packed_command)", *cpu_per_call(raw, n)),
        ]
        client.connection_pool.release(connection)
    return rows


def alone(step, between, n: int) -> tuple[float, float]:
    """(CPU us, wall us) of step(i) alone, with between(i) run after each and not counted."""
    cpu = wall = 0.0
    for i in range(n):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        step(i)
        cpu += time.process_time() - cpu0
        wall += time.perf_counter() - wall0
        between(i)
    return 1e6 * cpu / n, 1e6 * wall / n


def print_ablations(whole: dict, batch: tuple[float, float], scale: list) -> None:
    bare, decision = whole["bare"], whole["decision"]
    print(f"{'whole request in Django (median of interleaved chunks)':58} {'CPU us':>7} {'wall us':>8}")
    for name, (cpu, wall) in (
        ("bare view", bare),
        ("decision (the lean path)", decision),
        (DRF_PATH, whole[DRF_PATH]),
        ("batch of 100, per decision", batch),
    ):
        print(f"  {name:56} {cpu:7.1f} {wall:8.1f}")
    print(f"{'a decision without ... (saving = that step in place)':58} {'CPU us':>7} {'wall us':>8}")
    for name, (cpu, wall) in whole.items():
        if name not in ("bare", "decision", DRF_PATH):
            print(f"  {name:56} {decision[0] - cpu:7.1f} {decision[1] - wall:8.1f}")
    print("for scale, on their own:")
    for name, cpu, wall in scale:
        print(f"  {name:56} {cpu:7.1f} {wall:8.1f}")
    rest = whole["all of the above"][0] - bare[0]
    print(
        f"decision - bare: {decision[0] - bare[0]:.1f} us CPU; with every step above taken out the "
        f"decision still costs {rest:+.1f} us CPU against the bare view"
    )


OURS = [  # (a file of this repository, or a folder with its slash, its category)
    ("policies/tokens.py", "auth: token"),
    ("policies/api/auth.py", "auth: token"),
    ("policies/services/inputs.py", "parse_decision"),
    ("policies/compile.py", "policy cache"),
    ("policies/services/answers.py", "decision body + RateLimit headers"),
    ("policies/headers.py", "decision body + RateLimit headers"),
    ("policies/services/recording.py", "record: metrics + denial stats"),
    ("policies/telemetry.py", "record: metrics + denial stats"),
    ("core/stats/", "record: metrics + denial stats"),
    ("policies/api/decisions.py", "the view itself"),
    ("core/", "engine: limiter + Redis store"),
    ("bench/", "bench harness"),
]
LIBRARIES = [  # (a folder in site-packages or the stdlib, its category)
    ("prometheus_client/", "record: metrics + denial stats"),
    ("django_redis/", "redis-py (client side)"),
    ("redis/", "redis-py (client side)"),
    ("hiredis/", "redis-py (client side)"),
    ("rest_framework/", "DRF"),
    ("django/", "Django: handler, middleware, request, response"),
    ("json/", "json"),
]
SOCKET_CALLS = ("'sendall'", "'send'", "'recv'", "'recv_into'")


def category(function: tuple) -> str | None:
    """The category of a profiled function; None for a built-in, which counts with its caller
    (except socket calls: the Redis round trip's system calls)."""
    path, _, name = function
    if path == "~":
        return "socket calls (Redis round trip)" if any(call in name for call in SOCKET_CALLS) else None
    if path.startswith(ROOT + "/") and "site-packages/" not in path:
        inside = path[len(ROOT) + 1 :]
        return next((found for part, found in OURS if inside.startswith(part)), "ours: other")
    inside = path.split("site-packages/", 1)[-1] if "site-packages/" in path else path.rsplit("python3.11/", 1)[-1]
    return next((found for part, found in LIBRARIES if inside.startswith(part)), "other (stdlib, other packages)")


def cprofile(step, n: int) -> None:
    """cProfile (CPU time) over n whole decisions: CPU us per request by category. A
    built-in's time goes to its callers' categories, in proportion."""
    import cProfile
    import pstats

    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    for i in range(n):
        step(i)
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    totals: dict[str, float] = {}
    for function, (_, _, tottime, _, callers) in stats.items():
        found = category(function)
        shares = (
            {found: tottime}
            if found is not None
            else {
                category(caller) or "other (stdlib, other packages)": tottime
                * value[2]
                / (sum(v[2] for v in callers.values()) or 1.0)
                for caller, value in callers.items()
            }
        )
        for name, seconds in shares.items():
            totals[name] = totals.get(name, 0.0) + seconds
    totals.pop("bench harness", None)
    everything = sum(totals.values())
    print(
        f"cProfile of {n:,} decisions, CPU us per request by category (the profiler inflates "
        f"every call, so read these as shares):"
    )
    for name, seconds in sorted(totals.items(), key=lambda item: -item[1]):
        print(f"  {name:56} {1e6 * seconds / n:7.1f} {seconds / everything:6.1%}")
    print("  top functions by own time:")
    for (path, line, name), (_, calls, tottime, _, _) in sorted(stats.items(), key=lambda i: -i[1][2])[:12]:
        where = path.split("site-packages/")[-1].replace(ROOT + "/", "")
        print(f"    {1e6 * tottime / n:6.1f} us {calls / n:6.1f} calls/request  {name} ({where}:{line})")


# Main --------------------------------------------------------------------------------------


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before each run counts")
    parser.add_argument("--connections", type=int, default=16, help="keep-alive connections in all")
    parser.add_argument("--client-processes", type=int, default=2, help="load processes sharing them")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn -w")
    parser.add_argument("--threads", type=int, default=8, help="gunicorn --threads")
    parser.add_argument("--batch-size", type=int, default=100, help="decisions per batch request")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median counts")
    parser.add_argument(
        "--endpoints",
        default="bare,decision,batch",
        help="comma-separated, in the order each round runs them",
    )
    parser.add_argument(
        "--profile",
        choices=("auto", "always", "never"),
        default="auto",
        help="time the decision's pieces (auto: when the decision misses 0.8x bare)",
    )
    parser.add_argument(
        "--profile-requests",
        type=int,
        default=3000,
        help="requests per variant when profiling (in interleaved chunks of 200)",
    )
    parser.add_argument("--profile-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.endpoints = [e.strip() for e in args.endpoints.split(",") if e.strip()]
    unknown = set(args.endpoints) - set(PATHS)
    if unknown:
        parser.error(f"unknown endpoints {sorted(unknown)} (known: {', '.join(PATHS)})")
    return args


def main() -> None:
    args = parse_args()
    if args.profile_child:
        profile_child(args.profile_requests)
        return
    bench(args)


if __name__ == "__main__":
    main()
