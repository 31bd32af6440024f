"""The HTTP API under load, end to end: requests per second and latency of the real service
(gunicorn, `-c python:limiter_admin.gunicorn_conf`, one fresh SQLite database, its own
redis-server), for endpoints served by one gunicorn, side by side:

- healthz: `GET /healthz`, the app's liveness probe (Django and gunicorn, no decision): the
  peer that issue 22's targets name;
- bare: `POST /bench/bare`, a DRF APIView that answers a constant (no authentication, no
  permission check, the body not read), served from bench/settings.py + bench/urls.py
  (the app's URLs plus this one): the floor of Django + DRF + gunicorn;
- decision: `POST /api/v1/decisions`, Bearer token, a 3-level decision on Redis;
- batch: `POST /api/v1/decisions/batch` with --batch-size decisions per request.

Run: .venv/bin/python bench/http.py [--duration S] [--connections N] [--workers W]
     [--threads T[,T2...]] [--batch-size B] [--rounds R] [--endpoints healthz,decision,...]
     [--against CHECKOUT ...] [--worker-class sync,gthread,uvicorn,granian] [--no-keepalive]
     [--client python|wrk] [--rate 500,1000,2000 [--open-rounds R]] [--profile auto|always|never]

Load: --client-processes processes (fork), each with threads that hold one HTTP/1.1
connection to 127.0.0.1 each, --connections in all. Closed loop (the default): every
connection sends its next request as soon as the answer is in. Open loop (--rate): the
requests are due at a fixed rate, whatever the answers, spread over the same threads, and each
latency counts from when its request was due, so that a slow answer cannot hide the requests
queued behind it (wrk2's correction); p50 and p99 of a decision are reported against
/healthz's at the same rate. Connections are kept alive, or with --no-keepalive each request
goes on a connection of its own (`Connection: close`), its latency counted from before the
connect. The client writes prebuilt request bytes on a plain socket and reads the answer by
its Content-Length: 40 - 60 us of CPU per request, where http.client took about 160 us. The
client shares the machine's cores with the server, so a heavier client would take cores from
the server and hide part of the server's own differences. Each run warms up for --warmup
seconds, then counts --duration seconds: requests/s, and each request's latency for p50 and
p99. With --client wrk the closed loop is wrk's (Debian's `wrk`, --client-processes threads,
the same connections and prebuilt requests; a Lua response callback counts allowed and
degraded answers), as issue 22 measured: about 10 - 20 us of CPU per request.

Per run, the flushing threads' share of the server's CPU comes from the server's own /metrics
(limiter_flush_cpu_seconds, every worker's), read before and after the measured window.

Contenders: this checkout, and with --against each other checkout given, served by its own
gunicorn from its own tree (with its own bench/settings.py if it has one), each on a database
of the one redis-server of its own; with --worker-class a list, each checkout in each worker
class. The rounds are interleaved (each contender's endpoints in turn, a different contender
first each round) and the MEDIAN round counts; every round is printed, so the noise is
visible. CPU per request of the gunicorn processes, redis-server and the load generator
comes from /proc over each measured window (they all share the same cores), and the
redis-server's commands from INFO commandstats: script calls (FCALL) per request are a
decision's round trips.

Decisions that come back `degraded` (Redis did not answer within LIMITER_STORE_TIMEOUT, or the
breaker was open: the fail mode decided) are counted; rounds with any are left out of the ratios.

When the decision endpoint makes less than 0.8x /healthz's requests/s (or with --profile
always), a fresh process then calls this checkout's WSGI application directly, with the same
settings, database and Redis and no gunicorn. It times whole requests, then a decision with
one step of the gateway view stubbed out at a time (the saving is that step's cost in place),
then runs cProfile over decisions.
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
import importlib.util  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
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
    "healthz": "/healthz",
    "bare": "/bench/bare",
    "decision": "/api/v1/decisions",
    "batch": "/api/v1/decisions/batch",
}
GETS = frozenset(("healthz",))  # asked with GET and no body; their answers carry no decision
PEERS = ("healthz", "bare")  # what a decision is measured against, the target's first
ALLOWED = b'"allowed":true'
# A degraded decision never reached Redis: the store timed out (LIMITER_STORE_TIMEOUT) or its
# breaker was open, and the level's fail mode decided. Counted, and flagged in the report.
DEGRADED = b'"degraded":true'
# Issue 22: a decision at least 0.8x /healthz's requests/s, its p99 at most 10 ms at 16
# connections on a quiet machine; a batch at least 10x the single endpoint's decisions/s.
TARGETS = {"ratio": 0.8, "p99_ms": 10.0, "p99_connections": 16, "batch": 10.0}
CLOCK_TICK = os.sysconf("SC_CLK_TCK")


# The workload ------------------------------------------------------------------------------


def keys_of(user: int) -> dict:
    """1,000 users in 50 teams and one global key: the mix of bench/engine.py."""
    return {"user": f"user-{user}", "team": f"team-{user % TEAMS}", "global": "*"}


def bodies(endpoint: str, batch_size: int, seed: int = 7) -> list[bytes]:
    """JSON bodies: one decision per user (bare and decision: the same bodies), or batches of
    `batch_size` decisions on users drawn at random; none for a GET."""
    if endpoint in GETS:
        return [b""]
    if endpoint != "batch":
        return [json.dumps({"keys": keys_of(user)}).encode() for user in range(USERS)]
    rng = random.Random(seed)
    return [
        json.dumps({"requests": [{"keys": keys_of(rng.randrange(USERS))} for _ in range(batch_size)]}).encode()
        for _ in range(200)
    ]


def http_request(path: str, body: bytes, port: int, token: str, close: bool = False) -> bytes:
    """A POST's bytes; `close`: with `Connection: close` (one request per connection)."""
    closing = "Connection: close\r\n" if close else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{closing}\r\n"
    ).encode() + body


def requests_for(endpoint: str, port: int, token: str, batch_size: int, close: bool = False) -> list[bytes]:
    """The prebuilt requests an endpoint's load cycles through."""
    if endpoint in GETS:
        closing = "Connection: close\r\n" if close else ""
        return [f"GET {PATHS[endpoint]} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{closing}\r\n".encode()]
    return [http_request(PATHS[endpoint], body, port, token, close) for body in bodies(endpoint, batch_size)]


def per_request(endpoint: str, batch_size: int) -> int:
    """Decisions an answer carries: none for a probe."""
    return 0 if endpoint in GETS else batch_size if endpoint == "batch" else 1


# The load generator ------------------------------------------------------------------------


class Connection:
    """One HTTP/1.1 connection: send prebuilt request bytes, read one answer."""

    def __init__(self, port: int) -> None:
        self.port, self.sock, self.opened = port, None, 0

    def open(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.opened += 1

    def exchange(self, request: bytes) -> tuple[int, bytes]:
        """(status, body) on a kept-alive connection, opened again when the server says it
        closes it; raises ConnectionError when the server closed the connection."""
        status, body, closing = self._answer(request)
        if closing:
            self.open()
        return status, body

    def exchange_once(self, request: bytes) -> tuple[int, bytes]:
        """One request on a connection of its own, closed after its answer."""
        self.open()
        try:
            status, body, _ = self._answer(request)
            return status, body
        finally:
            self.sock.close()
            self.sock = None

    def _answer(self, request: bytes) -> tuple[int, bytes, bool]:
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
        return int(head[9:12]), body, b"\r\nconnection: close" in head

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

    latencies: array  # seconds, one per answer that counts
    errors: int  # answers other than 200, and lost connections
    decisions: int
    allowed: int
    degraded: int
    reconnects: int  # connections the server closed (kept-alive load only)
    late: int  # open loop: requests due in the window but never sent (the server fell behind)


class Pace(NamedTuple):
    """Open loop: request j of the load is due at start + j / rate, whatever the answers;
    thread `first` of `every` sends j = first, first + every, ... (rate: of the whole load)."""

    rate: float
    first: int
    every: int


# An open-loop thread behind its schedule stops sending this long after the window.
CATCH_UP = 5.0


def drive(
    port: int,
    requests: list[bytes],
    per_request: int,
    start: float,
    t0: float,
    t1: float,
    seed: int,
    pace: Pace | None = None,
    fresh: bool = False,
) -> Tally:
    """Send `requests` in a shuffled cycle from `start` until `t1`. Closed loop (no `pace`):
    the next request as soon as an answer is in, counting answers that arrive in [t0, t1),
    each from when it was sent. Open loop: each request at its due time (late ones at once),
    counting those due in [t0, t1), each from when it was due, so that a slow answer cannot
    hide the requests queued behind it. `fresh`: a connection per request (no keep-alive),
    its latency counted from before the connect."""
    order = list(range(len(requests)))
    random.Random(seed).shuffle(order)
    requests = [requests[i] for i in order]
    connection = Connection(port)
    send = connection.exchange_once if fresh else connection.exchange
    if not fresh:
        connection.open()
    time.sleep(max(0.0, start - time.monotonic()))
    latencies, errors, allowed, degraded, late, i, n = array("d"), 0, 0, 0, 0, 0, len(requests)
    monotonic, sleep = time.monotonic, time.sleep
    while True:
        if pace is None:
            if (since := monotonic()) >= t1:
                break
            counted = None  # by when the answer arrives
        else:
            since = start + (pace.first + i * pace.every) / pace.rate
            if since >= t1:
                break
            if (now := monotonic()) < since:
                sleep(since - now)
            elif now > t1 + CATCH_UP:  # too far behind: the rest counts as never sent
                late += since >= t0
                i += 1
                continue
            counted = t0 <= since
        try:
            status, body = send(requests[i % n])
        except (ConnectionError, OSError):
            errors += (monotonic() >= t0) if counted is None else counted
            if not fresh:
                connection.open()
            i += 1
            continue
        done = monotonic()
        i += 1
        if counted if counted is not None else t0 <= done < t1:
            latencies.append(done - since)
            if status != 200:
                errors += 1
            allowed += body.count(ALLOWED) if per_request > 1 else body.startswith(b"{" + ALLOWED)
            degraded += body.count(DEGRADED)
    if connection.sock is not None:
        connection.sock.close()
    reconnects = 0 if fresh else connection.opened - 1
    return Tally(latencies, errors, len(latencies) * per_request, allowed, degraded, reconnects, late)


def client_process(port, requests, per_request, threads, first, start, t0, t1, seed, paced, fresh, pipe) -> None:
    """One load process: `threads` threads, the load's threads `first`, `first` + 1, ...
    (`paced`: None for a closed loop, else the open loop's rate and its threads in all);
    sends its tallies and its CPU time back."""
    tallies: list[Tally] = []
    failures: list[str] = []

    def run(k: int) -> None:
        pace = None if paced is None else Pace(paced[0], first + k, paced[1])
        try:
            tallies.append(drive(port, requests, per_request, start, t0, t1, seed * 1000 + k, pace, fresh))
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


def flush_cpu(port: int) -> float:
    """The server's CPU seconds in its flushing threads so far, every worker's (its /metrics:
    limiter_flush_cpu_seconds, by what was flushed); 0 when it does not say."""
    try:
        status, text = Connection(port).exchange_once(
            f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        )
    except OSError:
        return 0.0
    if status != 200:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.decode("utf-8", "replace").splitlines()
        if line.startswith("limiter_flush_cpu_seconds_total")
    )


SCRIPT_COMMANDS = ("cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval")


def redis_calls(client) -> tuple[int, int, int]:
    """(script calls, all commands, us spent running scripts) of the redis-server so far, INFO
    itself left out. A decision's round trip is its script call (FCALL, or EVALSHA before Redis
    functions); all commands also count those a script runs inside (a 3-level decision: TIME,
    3 GETs, 3 SETs) and those the workers' flushing threads send in pipelines (statistics,
    decision records). The scripts' time (INFO commandstats' usec) against redis-server's CPU
    tells what a decision's script costs Redis and what the rest does (reading and writing its
    sockets, the flushers' commands)."""
    if client is None:
        return 0, 0, 0
    stats = client.info("commandstats")
    scripts = sum(stats.get(name, {}).get("calls", 0) for name in SCRIPT_COMMANDS)
    every = sum(value.get("calls", 0) for name, value in stats.items() if name != "cmdstat_info")
    in_scripts = sum(stats.get(name, {}).get("usec", 0) for name in SCRIPT_COMMANDS)
    return scripts, every, in_scripts


def load(
    port: int,
    requests: list[bytes],
    per_request: int,
    args,
    servers: dict[str, list[int]],
    *,
    rate: float | None = None,
    fresh: bool | None = None,
    redis=None,
) -> dict:
    """One run: --connections connections (threads) for --warmup + --duration seconds; closed
    loop, or open at `rate` requests/s; kept alive, or (`fresh`, by default --no-keepalive) a
    connection per request. `redis`: a client of the redis-server, whose commands are counted."""
    fresh = getattr(args, "no_keepalive", False) if fresh is None else fresh
    if getattr(args, "client", "python") == "wrk" and rate is None and not fresh:
        return load_by_wrk(port, requests, per_request, args, servers, redis)
    context = multiprocessing.get_context("fork")
    processes = min(args.client_processes, args.connections)
    share = [args.connections // processes + (k < args.connections % processes) for k in range(processes)]
    start = time.monotonic() + 0.5  # time to fork and connect
    t0, t1 = start + args.warmup, start + args.warmup + args.duration
    pipes, children = [], []
    paced = None if rate is None else (rate, args.connections)
    for k, threads in enumerate(share):
        ours, theirs = context.Pipe(duplex=False)
        child = context.Process(
            target=client_process,
            args=(port, requests, per_request, threads, sum(share[:k]), start, t0, t1, k + 1, paced, fresh, theirs),
        )
        child.start()
        pipes.append(ours)
        children.append(child)
    time.sleep(max(0.0, t0 - time.monotonic()))
    flushed0 = flush_cpu(port)
    before = {name: usage(pids) for name, pids in servers.items()}
    calls0 = redis_calls(redis)
    idle0 = machine_idle()
    time.sleep(max(0.0, t1 - time.monotonic()))
    used = {name: usage(pids) - before[name] for name, pids in servers.items()}
    idle = machine_idle() - idle0
    calls1 = redis_calls(redis)
    flushed = flush_cpu(port) - flushed0
    results = [pipe.recv() for pipe in pipes]
    for child in children:
        child.join()
    failures = [failure for _, _, process_failures in results for failure in process_failures]
    if failures:
        raise SystemExit(f"{len(failures)} load threads failed: {failures[0]}")
    found = summarise([(tallies, cpu) for tallies, cpu, _ in results], used, idle, per_request, args)
    return with_server_figures(found, calls0, calls1, flushed, used, rate, fresh)


def with_server_figures(found: dict, calls0, calls1, flushed: float, used: dict[str, Usage], rate, fresh) -> dict:
    """`found` and the run's Redis commands per answer, its rate and connections, and the
    flushing threads' share of the server's CPU (`flushed` CPU seconds)."""
    found["redis_calls"] = tuple((b - a) / found["answers"] for a, b in zip(calls0, calls1))
    found["rate"], found["fresh"] = rate, fresh
    server = used["gunicorn"].user + used["gunicorn"].system
    found["flush_share"] = flushed / server if server else 0.0
    return found


# --client wrk: the closed loop by wrk (Debian's `wrk`), --client-processes threads and
# --connections connections, cycling through the same prebuilt requests; a response callback
# counts what the answers say, and `done` prints the tallies on one line.
WRK_SCRIPT = """
local requests = {%s}
local threads = {}
i, seen, allowed, degraded, bad = 0, 0, 0, 0, 0  -- globals: done() reads them with thread:get
function setup(thread)
  thread:set("offset", #threads * 7919)
  table.insert(threads, thread)
end
function init(args)
  i = offset
end
function request()
  i = i + 1
  return requests[i %% #requests + 1]
end
function response(status, headers, body)
  seen = seen + 1
  if status ~= 200 then bad = bad + 1 end
  if body then
    local _, n = string.gsub(body, '"allowed":true', "")
    allowed = allowed + n
    local _, m = string.gsub(body, '"degraded":true', "")
    degraded = degraded + m
  end
end
function done(summary, latency, requests)
  local a, d, b, n = 0, 0, 0, 0
  for _, thread in ipairs(threads) do
    a, d = a + thread:get("allowed"), d + thread:get("degraded")
    b, n = b + thread:get("bad"), n + thread:get("seen")
  end
  local errors = summary.errors
  io.write(string.format("WRK %%d %%d %%d %%d %%d %%d %%d %%d %%d %%d %%d\\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99), latency.max, a, d, b + errors.connect + errors.read
    + errors.write + errors.timeout, n, errors.status, errors.connect))
end
"""


def lua_string(raw: bytes) -> str:
    """`raw` as a Lua string literal (decimal escapes for all but plain printable ASCII)."""
    return '"' + "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\{b:03d}" for b in raw) + '"'


def load_by_wrk(port: int, requests: list[bytes], per_request: int, args, servers: dict[str, list[int]], redis) -> dict:
    """One closed-loop run by wrk: a warm-up run, then the measured one, with the servers' CPU
    (and wrk's own, from the children this process has waited for) around it."""
    import resource

    with tempfile.NamedTemporaryFile("w", suffix=".lua", prefix="bench-wrk-") as script:
        script.write(WRK_SCRIPT % ",".join(lua_string(r) for r in requests))
        script.flush()
        base = ["wrk", "-t", str(args.client_processes), "-c", str(args.connections), "-s", script.name]
        url = f"http://127.0.0.1:{port}/"
        if args.warmup:
            subprocess.run([*base, "-d", f"{max(1, round(args.warmup))}s", url], capture_output=True, check=True)
        flushed0 = flush_cpu(port)
        before = {name: usage(pids) for name, pids in servers.items()}
        calls0, idle0 = redis_calls(redis), machine_idle()
        children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(
            [*base, "-d", f"{max(1, round(args.duration))}s", "--timeout", "10s", url], capture_output=True, text=True
        )
        children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        used = {name: usage(pids) - before[name] for name, pids in servers.items()}
        idle, calls1 = machine_idle() - idle0, redis_calls(redis)
        flushed = flush_cpu(port) - flushed0
    line = next((x for x in done.stdout.splitlines() if x.startswith("WRK ")), None)
    if done.returncode or line is None:
        raise SystemExit(f"wrk failed ({done.returncode}): {done.stdout[-800:]} {done.stderr[-800:]}")
    answers, micros, p50, p99, top, allowed, degraded, errors, seen, status, _ = (int(x) for x in line.split()[1:])
    if not answers:
        raise SystemExit("no answer arrived in the measured window")
    seconds = micros / 1e6
    client = (children1.ru_utime + children1.ru_stime) - (children0.ru_utime + children0.ru_stime)
    decisions = answers * per_request
    found = {
        "answers": answers,
        "requests_s": answers / seconds,
        "decisions_s": decisions / seconds,
        "p50_ms": p50 / 1e3,
        "p99_ms": p99 / 1e3,
        "max_ms": top / 1e3,
        "allowed": allowed / max(decisions, 1),
        "degraded": degraded / max(decisions, 1),
        "errors": errors,
        "reconnects": 0,
        "late": 0,
    }
    found.update(machine_figures(used, idle, client, answers, seconds))
    return with_server_figures(found, calls0, calls1, flushed, used, None, False)


def summarise(results, used: dict[str, Usage], idle: float, per_request: int, args) -> dict:
    tallies = [tally for process_tallies, _ in results for tally in process_tallies]
    latencies = sorted(x for tally in tallies for x in tally.latencies)
    answers = len(latencies)
    if not answers:
        raise SystemExit("no answer arrived in the measured window")
    decisions = sum(tally.decisions for tally in tallies)
    found = {
        "answers": answers,
        "requests_s": answers / args.duration,
        "decisions_s": decisions / args.duration,
        "p50_ms": 1e3 * latencies[int(0.50 * (answers - 1))],
        "p99_ms": 1e3 * latencies[int(0.99 * (answers - 1))],
        "max_ms": 1e3 * latencies[-1],
        "allowed": sum(tally.allowed for tally in tallies) / max(decisions, 1),
        "degraded": sum(tally.degraded for tally in tallies) / max(decisions, 1),
        "errors": sum(tally.errors for tally in tallies),
        "reconnects": sum(tally.reconnects for tally in tallies),
        "late": sum(tally.late for tally in tallies),
    }
    found.update(machine_figures(used, idle, sum(cpu for _, cpu in results), answers, args.duration))
    return found


def machine_figures(used: dict[str, Usage], idle: float, client: float, answers: int, seconds: float) -> dict:
    """What a run's `answers` cost the machine in `seconds`: CPU per answer of each server and
    of the load generator (`client` CPU seconds), gunicorn's system share and switches, the
    idle share, and the cores that other processes took."""
    found = {
        "cpu_us": {name: 1e6 * (u.user + u.system) / answers for name, u in used.items()},
        "gunicorn_system": used["gunicorn"].system / ((used["gunicorn"].user + used["gunicorn"].system) or 1),
        "switches": used["gunicorn"].switches / answers,
        "idle": idle / (os.cpu_count() * seconds),
    }
    found["cpu_us"]["load generator"] = 1e6 * client / answers
    # Whatever else ran meanwhile (other people's jobs on a shared machine): busy time that
    # none of our processes accounts for, in cores.
    busy = os.cpu_count() * seconds - idle
    ours = sum(u.user + u.system for u in used.values()) + client
    found["other_cores"] = max(0.0, busy - ours) / seconds
    return found


# The service -------------------------------------------------------------------------------

# --worker-class: gunicorn's worker class and the application it loads. gthread is what
# `make run` serves (limiter_admin/gunicorn_conf.py, --threads 8); sync is one thread a
# worker (tests/serving.Service passes --threads 1: gunicorn turns sync with threads into
# gthread); uvicorn is the uvicorn-worker package's worker under gunicorn, serving Django's
# ASGI application (uvloop and httptools when installed); asgi is gunicorn's own ASGI worker.
WORKER_CLASSES = {
    "sync": ("sync", "limiter_admin.wsgi"),
    "gthread": ("gthread", "limiter_admin.wsgi"),
    "uvicorn": ("uvicorn_worker.UvicornWorker", "limiter_admin.asgi:application"),
    "asgi": ("gunicorn.workers.gasgi.ASGIWorker", "limiter_admin.asgi:application"),
    "granian": ("granian", "limiter_admin.gateway_wsgi:application"),
}
AS_CONFIGURED = "as configured"  # no -k: what limiter_admin/gunicorn_conf.py says
THREADED = ("gthread", AS_CONFIGURED, "granian")  # the classes whose --threads matter
PATIENT = 10.0  # seconds: the bench's own Redis calls (INFO) wait out a busy machine


class Contender(NamedTuple):
    """One gunicorn under the same load: ours, or another checkout's (--against), in a worker
    class with a number of threads; `endpoints`: those it answers; `settings`: its
    DJANGO_SETTINGS_MODULE."""

    label: str
    kind: str
    threads: int
    service: object
    endpoints: list[str]
    servers: dict[str, list[int]]
    settings: str


def settings_of(root: str) -> str:
    """bench/settings.py of that checkout (its /bench/bare) if it has one; else the app's own
    settings, where only the app's endpoints answer."""
    return "bench.settings" if os.path.exists(os.path.join(root, "bench", "settings.py")) else "limiter_admin.settings"


def serve(args, url: str, root: str = ROOT, worker_class: str = AS_CONFIGURED, threads: int | None = None):
    """A Service of `root` (this checkout by default) on `url`, with the bench's policy;
    `threads`: gunicorn's --threads (None: args.threads)."""
    from tests.serving import Service

    kind, app = WORKER_CLASSES.get(worker_class, (None, "limiter_admin.wsgi"))
    if kind == "granian" and not os.path.exists(os.path.join(root, "limiter_admin", "gateway_wsgi.py")):
        app = "limiter_admin.wsgi:application"  # a tree from before the gateways' pool was granian's
    return Service(
        POLICY,
        redis_url=url,
        workers=args.workers,
        threads=args.threads if threads is None else threads,
        extra_env={"DJANGO_SETTINGS_MODULE": settings_of(root)},
        root=root,
        worker_class=None if kind == "granian" else kind,
        app=app,
        server="granian" if kind == "granian" else "gunicorn",
    )


def answering(service, endpoints: list[str], batch_size: int) -> dict[str, str]:
    """endpoint -> what is wrong with its first answer ("" when it answers as expected)."""
    found = {}
    for endpoint in endpoints:
        request = requests_for(endpoint, service.port, service.token, batch_size)[0]
        status, answer = Connection(service.port).exchange_once(request)
        expected = b'"status"' if endpoint in GETS else ALLOWED
        found[endpoint] = "" if status == 200 and expected in answer else f"{status} {answer[:200]!r}"
    return found


def variants(args) -> list[tuple[str, int, str]]:
    """(worker class, threads, label suffix) of each --worker-class and --threads asked for;
    the number of threads varies only for the classes that use threads."""
    found = []
    for kind in args.worker_class:
        for threads in args.threads if kind in THREADED else [1]:  # sync: one; ASGI: unused
            suffix = kind if len(args.worker_class) > 1 else ""
            if len(args.threads) > 1 and kind in THREADED:
                suffix = f"{suffix} x{threads}".strip()
            found.append((kind, threads, suffix))
    return found


def contenders(args, url: str, stack: contextlib.ExitStack) -> list[Contender]:
    """Every checkout (ours first, then each --against) in every --worker-class (and number of
    --threads), started, each on a database of the one redis-server of its own (their keys and
    statistics apart)."""
    from core.stores.redis import connect

    found: list[Contender] = []
    redis_pid = int(connect(url, PATIENT).info("server")["process_id"])
    checkouts = [("ours", ROOT), *((os.path.basename(os.path.abspath(c)), os.path.abspath(c)) for c in args.against)]
    for name, root in checkouts:
        for kind, threads, suffix in variants(args):
            label = f"{name} {suffix}".strip()
            database = f"{url.rsplit('/', 1)[0]}/{len(found)}"
            service = stack.enter_context(serve(args, database, root, kind, threads))
            wrong = answering(service, args.endpoints, args.batch_size)
            if root == ROOT and any(wrong.values()):
                raise SystemExit(f"{label}: {wrong}\n{service.read_log()}")
            for endpoint, what in wrong.items():
                if what:
                    print(f"{label}: {endpoint} left out, it answers {what}")
            settings = settings_of(root)
            if settings != "bench.settings":
                print(f"{label}: no bench/settings.py in {root}: served with {settings}")
            pids = [service.process.pid, *service.worker_pids()]
            endpoints = [e for e in args.endpoints if not wrong[e]]
            servers = {"gunicorn": pids, "redis-server": [redis_pid]}
            found.append(Contender(label, kind, threads, service, endpoints, servers, settings))
    return found


def bench(args) -> None:
    from bench.redis_store import redis_server
    from core.stores.redis import connect

    with redis_server(None) as url, contextlib.ExitStack() as stack:
        entrants = contenders(args, url, stack)
        redis = connect(url, PATIENT)
        work = {
            c.label: {
                e: (
                    requests_for(e, c.service.port, c.service.token, args.batch_size, args.no_keepalive),
                    per_request(e, args.batch_size),
                )
                for e in c.endpoints
            }
            for c in entrants
        }
        closed: list[dict] = []
        open_loop: dict[float, list[dict]] = {rate: [] for rate in args.rate}
        if args.rounds or args.rate:
            print(HEADER)
        for rate in ([None] if args.rounds else []) + args.rate:  # the closed loop, then each rate
            for number in range(1, (args.rounds if rate is None else args.open_rounds) + 1):
                found: dict[str, dict] = {}
                turn = (number - 1) % len(entrants)  # each contender goes first in turn
                for contender in entrants[turn:] + entrants[:turn]:
                    found[contender.label] = {}
                    for endpoint, (requests, decisions) in work[contender.label].items():
                        run = load(
                            contender.service.port, requests, decisions, args, contender.servers, rate=rate, redis=redis
                        )
                        found[contender.label][endpoint] = run
                        print_run(number, f"{contender.label} {endpoint}", run)
                (closed if rate is None else open_loop[rate]).append(found)
        for contender in entrants:
            if closed:
                report([r[contender.label] for r in closed], args, contender)
        if len(entrants) > 1 and closed:
            against(closed, entrants, args)
        if args.rate:
            report_open(open_loop, entrants, args)
        ours = entrants[0]
        if args.profile == "always" or (closed and want_profile(args, [r[ours.label] for r in closed])):
            profile_in_child(ours.service, url, args)


# Reporting ---------------------------------------------------------------------------------

HEADER = (
    f"{'round':>5} {'endpoint':22} {'req/s':>8} {'decisions/s':>12} {'p50 ms':>7} {'p99 ms':>7} "
    f"{'max ms':>7} {'allowed':>8} {'degraded':>8} {'errors':>6} | CPU us per request: gunicorn (system share, "
    f"context switches), redis-server (of which running scripts), load generator | Redis per "
    f"request: script calls / all commands, those run inside scripts and by the flushers "
    f"included | the flushing threads' share of the server's CPU | idle | other processes"
)


def print_run(number, endpoint: str, found: dict) -> None:
    cpu = found["cpu_us"]
    decides = found["decisions_s"] > 0
    allowed = f"{found['allowed']:8.1%} {found['degraded']:8.1%}" if decides else f"{'-':>8} {'-':>8}"
    scripts, every, in_scripts = found.get("redis_calls", (0.0, 0.0, 0.0))
    paced = f" at {found['rate']:,.0f}/s" if found.get("rate") else ""
    late = f", {found['late']} late" if found.get("late") else ""
    print(
        f"{number:>5} {endpoint + paced:22} {found['requests_s']:8,.0f} {found['decisions_s']:12,.0f} "
        f"{found['p50_ms']:7.2f} {found['p99_ms']:7.2f} {found['max_ms']:7.1f} {allowed} "
        f"{found['errors']:6} | {cpu['gunicorn']:6,.0f} ({found['gunicorn_system']:.0%} sys, "
        f"{found['switches']:.1f} sw), {cpu['redis-server']:4,.0f} ({in_scripts:.0f} in scripts), "
        f"{cpu['load generator']:3,.0f} | "
        f"{scripts:.2f} / {every:.2f} | {found.get('flush_share', 0):4.1%} | {found['idle']:3.0%} | "
        f"{found['other_cores']:.2f} cores{late}",
        flush=True,
    )


def median(rounds: list[dict], endpoint: str, field: str) -> float:
    return statistics.median(found[endpoint][field] for found in rounds)


def server_us(found: dict) -> float:
    """CPU us per request of the server's processes: gunicorn and redis-server."""
    return found["cpu_us"]["gunicorn"] + found["cpu_us"]["redis-server"]


def report(rounds: list[dict], args, contender: Contender | None = None) -> dict:
    """The median round of each endpoint, and the ratios against the targets."""
    endpoints = contender.endpoints if contender else args.endpoints
    label, kind, threads = (
        (contender.label, contender.kind, contender.threads)
        if contender
        else ("ours", args.worker_class[0], args.threads[0])
    )
    print(
        f"\n{label}: median of {len(rounds)} interleaved rounds; {args.connections} "
        f"{'new connections a request' if args.no_keepalive else 'keep-alive connections'} from "
        f"{min(args.client_processes, args.connections)} load processes; gunicorn -w {args.workers} "
        f"--threads {threads}, worker class {kind}; batch {args.batch_size}; {args.duration:g} s per run after "
        f"{args.warmup:g} s warm-up; Python {sys.version.split()[0]}, {os.cpu_count()} cores"
    )
    print(
        "The load generator, redis-server and gunicorn share the same cores: every figure is "
        "for this whole machine, client included."
    )
    print(
        f"{'endpoint':9} {'req/s':>8} {'decisions/s':>12} {'p50 ms':>7} {'p99 ms':>7} {'allowed':>8} "
        f"{'CPU us/req: gunicorn':>21} {'all three':>10} {'decisions/server CPU-s':>23} {'scripts/req':>11} "
        f"{'flushers':>8} {'redis us/req (scripts)':>22}"
    )
    for endpoint in endpoints:
        cpu = statistics.median(found[endpoint]["cpu_us"]["gunicorn"] for found in rounds)
        per_cpu = statistics.median(
            1e6 * found[endpoint]["decisions_s"] / found[endpoint]["requests_s"] / server_us(found[endpoint])
            for found in rounds
        )
        scripts = statistics.median(found[endpoint]["redis_calls"][0] for found in rounds)
        redis_us = statistics.median(found[endpoint]["cpu_us"]["redis-server"] for found in rounds)
        in_scripts = statistics.median(found[endpoint]["redis_calls"][2] for found in rounds)
        print(
            f"{endpoint:9} {median(rounds, endpoint, 'requests_s'):8,.0f} "
            f"{median(rounds, endpoint, 'decisions_s'):12,.0f} {median(rounds, endpoint, 'p50_ms'):7.2f} "
            f"{median(rounds, endpoint, 'p99_ms'):7.2f} {median(rounds, endpoint, 'allowed'):8.1%} {cpu:21,.0f} "
            f"{statistics.median(machine_us(found[endpoint]) for found in rounds):10,.0f} "
            f"{per_cpu:23,.0f} {scripts:11.2f} {median(rounds, endpoint, 'flush_share'):8.1%} "
            f"{redis_us:15,.0f} ({in_scripts:4.0f})"
        )
    degraded = max(found[endpoint]["degraded"] for found in rounds for endpoint in endpoints)
    if degraded:
        print(
            f"DEGRADED decisions in some runs (up to {degraded:.1%}): Redis did not answer within "
            f"LIMITER_STORE_TIMEOUT, or the breaker was open, and the fail mode decided without it. "
            f"Those runs measure the fail-open path, not Redis: compare runs without any."
        )
    other = max(found[endpoint]["other_cores"] for found in rounds for endpoint in endpoints)
    if other > 0.1:
        print(
            f"Other processes used up to {other:.2f} cores during these runs: the figures above are "
            f"lower and noisier than on a quiet machine (see each run's last column)."
        )
    return ratios(rounds, args, endpoints)


def ratios(rounds: list[dict], args, endpoints: list[str] | None = None) -> dict:
    """The targets, over the rounds in which no decision was degraded (those measure the fail
    mode, not Redis)."""
    endpoints = args.endpoints if endpoints is None else endpoints
    found = {}
    for peer in PEERS:
        if {peer, "decision"} <= set(endpoints):
            clean = [r for r in rounds if not r["decision"]["degraded"]]
            if clean:
                per_round = [r["decision"]["requests_s"] / r[peer]["requests_s"] for r in clean]
                cpu = [machine_us(r[peer]) / machine_us(r["decision"]) for r in clean]
                found[peer] = statistics.median(per_round)
                target = (
                    f"; target >= {TARGETS['ratio']}x: {verdict(found[peer] >= TARGETS['ratio'])}"
                    if peer == "healthz"
                    else ""
                )
                print(
                    f"decision / {peer} requests/s: {found[peer]:.2f}x median (rounds {spread(per_round)})"
                    f"{target}. By CPU per request of all three (what a quiet machine would give): "
                    f"{statistics.median(cpu):.2f}x (rounds {spread(cpu)}){excluded(rounds, clean)}"
                )
            else:
                print(f"decision / {peer}: every round had degraded decisions; rerun on a quieter machine")
    found["ratio"] = found.get("healthz", found.get("bare", 0.0))
    if "decision" in endpoints:
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
    if {"decision", "batch"} <= set(endpoints):
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


def against(rounds: list[dict], entrants: list[Contender], args) -> None:
    """Each contender against the first (ours), endpoint by endpoint, round by round."""
    ours = entrants[0]
    print(f"\nagainst {ours.label}, round by round (median, and the rounds' spread):")
    print(
        f"{'contender':24} {'endpoint':9} {'req/s, ours / theirs':>22} {'gunicorn CPU/req, theirs / ours':>32} "
        f"{'p99 ms, theirs':>15} {'decision / healthz':>19}"
    )
    for contender in entrants[1:]:
        for endpoint in [e for e in ours.endpoints if e in contender.endpoints]:
            faster = [
                r[ours.label][endpoint]["requests_s"] / r[contender.label][endpoint]["requests_s"] for r in rounds
            ]
            dearer = [
                r[contender.label][endpoint]["cpu_us"]["gunicorn"] / r[ours.label][endpoint]["cpu_us"]["gunicorn"]
                for r in rounds
            ]
            p99 = statistics.median(r[contender.label][endpoint]["p99_ms"] for r in rounds)
            ratio = ""
            if endpoint == "decision" and "healthz" in contender.endpoints:
                theirs = [r[contender.label] for r in rounds]
                peer = statistics.median(r["decision"]["requests_s"] / r["healthz"]["requests_s"] for r in theirs)
                ratio = f"{peer:.2f}x"
            print(
                f"{contender.label:24} {endpoint:9} {statistics.median(faster):8.2f}x ({spread(faster)}) "
                f"{statistics.median(dearer):12.2f}x ({spread(dearer)}) {p99:15.1f} {ratio:>19}"
            )


def report_open(open_loop: dict[float, list[dict]], entrants: list[Contender], args) -> None:
    """Open loop: p50 and p99 of each endpoint at each rate, and what a decision adds to the
    peer's (/healthz, else the first endpoint) at the same rate, round by round."""
    fresh = getattr(args, "no_keepalive", False)  # bench/forward_auth.py's runs are kept alive
    print(
        f"\nopen loop: requests sent at a fixed rate over {args.connections} "
        f"{'new connections a request' if fresh else 'keep-alive connections'}, each latency "
        f"counted from when the request was due; median of rounds (p99 added: the median of each round's "
        f"decision p99 less its peer's)"
    )
    print(
        f"{'contender':24} {'rate/s':>7} {'endpoint':9} {'answered/s':>10} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'p50 added':>10} {'p99 added':>10} {'late':>5} {'gunicorn CPU us/req':>20}"
    )
    for contender in entrants:
        peer = "healthz" if "healthz" in contender.endpoints else contender.endpoints[0]
        for rate, rounds in open_loop.items():
            for endpoint in contender.endpoints:
                runs = [r[contender.label][endpoint] for r in rounds]
                added = ["", ""]
                if endpoint != peer:
                    theirs = [r[contender.label] for r in rounds]
                    for k, field in enumerate(("p50_ms", "p99_ms")):
                        added[k] = f"{statistics.median(r[endpoint][field] - r[peer][field] for r in theirs):+.2f}"
                print(
                    f"{contender.label:24} {rate:7,.0f} {endpoint:9} "
                    f"{statistics.median(x['requests_s'] for x in runs):10,.0f} "
                    f"{statistics.median(x['p50_ms'] for x in runs):7.2f} "
                    f"{statistics.median(x['p99_ms'] for x in runs):7.2f} {added[0]:>10} {added[1]:>10} "
                    f"{sum(x['late'] for x in runs):5} "
                    f"{statistics.median(x['cpu_us']['gunicorn'] for x in runs):20,.0f}"
                )


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
    peer = next((p for p in PEERS if p in args.endpoints), None)
    if peer is None or "decision" not in args.endpoints:
        return False
    ratio = statistics.median(r["decision"]["requests_s"] / r[peer]["requests_s"] for r in rounds)
    return ratio < TARGETS["ratio"]


# Where a decision's time goes: in one process, no gunicorn ---------------------------------


def profile_in_child(service, url: str, args) -> None:
    """Time the pieces in a fresh process on the service's own database and Redis (so that
    Django starts with the bench settings, and Prometheus in multiprocess mode, as under
    gunicorn)."""
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as metrics:
        env = {
            **service.env,
            "REDIS_URL": service.env.get("REDIS_URL", url),
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "PROMETHEUS_MULTIPROC_DIR": metrics,
            "BENCH_TOKEN": service.token,
        }
        print(
            "\nWhere a decision's time goes (in one process: the WSGI application that gunicorn "
            "serves, limiter_admin.wsgi, called directly with the bench settings, the same database "
            "and Redis, no gunicorn, no load):",
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


def environ(path: str, body: bytes, token: str, method: str = "POST") -> dict:
    import io

    return {
        "REQUEST_METHOD": method,
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
    """Whole requests through the WSGI application gunicorn serves (limiter_admin.wsgi: the
    gateway front before Django's handler), then the same decision through Django's handler
    alone, then with one step of the gateway view taken out at a time (its saving is what the
    step costs in place), then cProfile by category."""
    import warnings

    import django

    warnings.filterwarnings("ignore", message="No directory at")  # whitenoise: no collectstatic here

    django.setup()
    from django.core.wsgi import get_wsgi_application

    from limiter_admin import wsgi

    served, token = wsgi.application, os.environ["BENCH_TOKEN"]
    handler = getattr(wsgi, "django_application", None) or get_wsgi_application()
    singles, batches = bodies("decision", 1), bodies("batch", 100)

    def call(path: str, body: bytes, app=served, method: str = "POST") -> None:
        statuses = []
        result = app(environ(path, body, token, method), lambda status, headers, exc_info=None: statuses.append(status))
        try:
            content = b"".join(result)
        finally:
            close = getattr(result, "close", None)  # the gateway front answers a list
            if close is not None:
                close()  # request_finished, as gunicorn does
        if not statuses[0].startswith("200"):
            raise SystemExit(f"{path}: {statuses[0]} {content[:300]!r}")

    steps = {
        "healthz": lambda i: call(PATHS["healthz"], b"", method="GET"),
        "bare": lambda i: call(PATHS["bare"], singles[i % USERS]),
        "decision": lambda i: call(PATHS["decision"], singles[i % USERS]),
        HANDLER_PATH: lambda i: call(PATHS["decision"], singles[i % USERS], handler),
    }
    for i in range(2 * USERS):  # every user's plan built, every lazy thing made
        for step in steps.values():
            step(i)
        call("/bench/plain", singles[i % USERS])
    cpu_per_call(lambda i: call(PATHS["batch"], batches[i % len(batches)]), 20)
    runs = {name: [] for name in steps} | ablations()
    chunk = 200
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for cycle in range(max(3, n // chunk)):  # small interleaved chunks: the machine's drift hits all alike
        for name, patches in runs.items():
            step = steps.get(name, steps["decision"])
            with patched(patches):
                found[name].append(cpu_per_call(step, chunk, cycle * chunk))
    batch = cpu_per_call(lambda i: call(PATHS["batch"], batches[i % len(batches)]), max(10, n // 100))
    whole = {
        name: (statistics.median(c for c, _ in values), statistics.median(w for _, w in values))
        for name, values in found.items()
    }
    print_ablations(whole, (batch[0] / 100, batch[1] / 100), for_scale(call, singles, n))
    cprofile(steps["decision"], n)


HANDLER_PATH = "decision through Django's handler (no gateway front)"
WHOLE = ("healthz", "bare", "decision", HANDLER_PATH)


def ablations() -> dict[str, list[tuple[object, dict]]]:
    """name -> the (object, {attribute: stand-in}) patches that take one step out of a
    decision on the gateway path (GatewayView.dispatch and caller, DecisionView.answer,
    policies.services.decisions.ask): the view answers as before, minus that work."""
    from limiter_admin import gateway_front
    from limiter_admin.gateway_front import GatewayFront
    from policies.api import decisions as views
    from policies.api import gateway
    from policies.policy import TENANT_LEVEL
    from policies.services import decisions as service
    from policies.services import inputs

    cache = service.policy_cache()
    policy = cache.current()
    some_keys = keys_of(1)
    limiter = cache.limiter_for(some_keys[TENANT_LEVEL])
    fixed = limiter.acquire(some_keys)
    asked = inputs.parse_decision({"keys": some_keys}, policy)
    identity = gateway.bearer_identity(f"Bearer {os.environ['BENCH_TOKEN']}")

    class Cached:
        def current(self):
            return policy

        def limiter_for(self, team):
            return limiter

    from limiter_admin import wsgi

    front = wsgi.application
    while not isinstance(front, GatewayFront):
        front = front.application  # inside ChunkedBodies

    steps = {
        "token authentication (bearer_identity)": [(gateway, {"bearer_identity": lambda header: identity})],
        "body: read + json.loads (read_json)": [(gateway, {"read_json": lambda request: {"keys": some_keys}})],
        "parse_decision": [(inputs, {"parse_decision": lambda data, p: asked})],
        "policy cache: current() + limiter_for()": [(service, {"policy_cache": Cached})],
        "limiter.acquire: plan + FCALL round trip": [
            (type(limiter), {"acquire": lambda self, keys, cost=1, priority=None: fixed})
        ],
        "record: metrics, statistics, decision record": [
            (service, {"record": lambda keys, d, cost=1, priority=None: None})
        ],
        "RateLimit headers (decision_headers)": [(views, {"decision_headers": lambda *a: {}})],
        "timing: limiter_decision_seconds (observe_seconds)": [(gateway, {"observe_seconds": lambda e, s: None})],
        "middleware around the view (the front's direct path)": [(front, {"_direct": gateway_front.answer})],
        "(negative) the whole middleware chain, not the direct path": [(front, {"_direct": front._chain})],
    }
    steps["all of the above"] = [patch for patches in steps.values() for patch in patches]
    return steps


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
    healthz, decision = whole["healthz"], whole["decision"]
    print(f"{'whole request in process (median of interleaved chunks)':58} {'CPU us':>7} {'wall us':>8}")
    for name, (cpu, wall) in (
        ("healthz", healthz),
        ("bare view (DRF)", whole["bare"]),
        ("decision (as served: the gateway front)", decision),
        (HANDLER_PATH, whole[HANDLER_PATH]),
        ("batch of 100, per decision", batch),
    ):
        print(f"  {name:56} {cpu:7.1f} {wall:8.1f}")
    print(f"{'a decision without ... (saving = that step in place)':58} {'CPU us':>7} {'wall us':>8}")
    for name, (cpu, wall) in whole.items():
        if name not in WHOLE:
            print(f"  {name:56} {decision[0] - cpu:7.1f} {decision[1] - wall:8.1f}")
    print("for scale, on their own:")
    for name, cpu, wall in scale:
        print(f"  {name:56} {cpu:7.1f} {wall:8.1f}")
    rest = whole["all of the above"][0] - healthz[0]
    print(
        f"decision - healthz: {decision[0] - healthz[0]:.1f} us CPU; with every step above taken out the "
        f"decision still costs {rest:+.1f} us CPU against /healthz"
    )


OURS = [  # (a file of this repository, or a folder with its slash, its category)
    ("policies/tokens.py", "auth: token"),
    ("policies/api/auth.py", "auth: token"),
    ("policies/services/auth.py", "auth: token"),
    ("policies/services/inputs.py", "parse_decision"),
    ("policies/compile.py", "policy cache"),
    ("policies/services/answers.py", "decision body + RateLimit headers"),
    ("policies/headers.py", "decision body + RateLimit headers"),
    ("policies/services/recording.py", "record: metrics + denial stats"),
    ("policies/telemetry.py", "record: metrics + denial stats"),
    ("policies/metrics.py", "record: metrics + denial stats"),
    ("core/stats/", "record: metrics + denial stats"),
    ("policies/api/decisions.py", "the view itself"),
    ("policies/api/gateway.py", "the view itself"),
    ("policies/api/parsers.py", "the view itself"),
    ("policies/services/decisions.py", "the view itself"),
    ("policies/services/leases.py", "the view itself"),
    ("limiter_admin/gateway_front.py", "gateway front + console_only"),
    ("limiter_admin/console_only.py", "gateway front + console_only"),
    ("limiter_admin/chunked.py", "gateway front + console_only"),
    ("limiter_admin/", "ours: limiter_admin middleware"),
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


def parse_rates(parser: argparse.ArgumentParser, text: str) -> list[float]:
    """--rate's comma-separated requests/s, each above 0; else the parser's error (exit 2)."""
    try:
        rates = [float(r) for r in text.split(",") if r.strip()]
    except ValueError:
        parser.error(f"--rate: comma-separated requests per second, not {text!r}")
    if any(not r > 0 for r in rates):
        parser.error(f"--rate: each rate must be above 0, not {text!r}")
    return rates


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before each run counts")
    parser.add_argument("--connections", type=int, default=16, help="connections (load threads) in all")
    parser.add_argument("--client-processes", type=int, default=2, help="load processes sharing them")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn -w")
    parser.add_argument(
        "--threads", default="8", help="gunicorn --threads (gthread); comma-separated, each a contender"
    )
    parser.add_argument("--batch-size", type=int, default=100, help="decisions per batch request")
    parser.add_argument("--rounds", type=int, default=3, help="closed-loop rounds (0: none); the median counts")
    parser.add_argument(
        "--endpoints",
        default="healthz,bare,decision,batch",
        help=f"comma-separated, in the order each round runs them ({', '.join(PATHS)})",
    )
    parser.add_argument(
        "--against",
        action="append",
        default=[],
        metavar="CHECKOUT",
        help="another checkout to serve beside ours under the same load, round by round (repeatable)",
    )
    parser.add_argument(
        "--worker-class",
        default=AS_CONFIGURED,
        help=f"comma-separated, each a contender: {', '.join(WORKER_CLASSES)} (default: as "
        f"limiter_admin/gunicorn_conf.py and --threads make it)",
    )
    parser.add_argument("--no-keepalive", action="store_true", help="a new connection per request (Connection: close)")
    parser.add_argument(
        "--client",
        choices=("python", "wrk"),
        default="python",
        help="the closed loop's load generator: ours (threads in --client-processes processes), or "
        "wrk (Debian's; --client-processes threads) as issue 22 measures; open loop and "
        "--no-keepalive are ours",
    )
    parser.add_argument(
        "--rate",
        default="",
        help="open loop: comma-separated requests/s (e.g. 500,1000,2000), run after the closed loop",
    )
    parser.add_argument("--open-rounds", type=int, default=None, help="rounds at each --rate (default: --rounds)")
    parser.add_argument(
        "--profile",
        choices=("auto", "always", "never"),
        default="auto",
        help="time the decision's pieces (auto: when the decision misses 0.8x /healthz)",
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
    args.worker_class = [k.strip() for k in args.worker_class.split(",") if k.strip()]
    unknown = set(args.worker_class) - set(WORKER_CLASSES) - {AS_CONFIGURED}
    if unknown:
        parser.error(f"unknown worker classes {sorted(unknown)} (known: {', '.join(WORKER_CLASSES)})")
    args.threads = [int(t) for t in args.threads.split(",") if t.strip()]
    if args.client == "wrk" and shutil.which("wrk") is None:
        parser.error("--client wrk needs wrk on the PATH (Debian: apt-get install wrk)")
    if "granian" in args.worker_class and importlib.util.find_spec("granian") is None:
        parser.error("--worker-class granian needs granian (requirements.txt: make venv)")
    args.rate = parse_rates(parser, args.rate)
    args.open_rounds = args.rounds if args.open_rounds is None else args.open_rounds
    if not args.rounds and not args.rate and args.profile != "always":
        parser.error("nothing to run: --rounds 0, no --rate and no --profile always")
    return args


def main() -> None:
    args = parse_args()
    if args.profile_child:
        profile_child(args.profile_requests)
        return
    bench(args)


if __name__ == "__main__":
    main()
