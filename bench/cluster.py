"""Decisions per second of our 3-level decision (user, team, global; a token bucket each) on
one redis-server against a Redis Cluster of 3 primaries, from the same client processes; then
the ceiling of one Redis core for our script call, from redis-benchmark.

Part 1, the race. The script starts a plain redis-server and a cluster (3 primaries, no
replicas unless --replicas; cluster-require-full-coverage no), each on free loopback ports
with no RDB and no AOF, and stops them at the end, also on an error. P client processes
(multiprocessing, spawn) of T threads each run a closed loop (each thread sends its next
decision as soon as the answer is in) for D seconds after a second of warm-up. Contenders, in
interleaved rounds (the order turns every round); the median round counts:

- single Redis: `RedisStore` (`redis://`), one script call per decision;
- cluster split: `ClusterStore` (`redis-cluster://`), the global level split into sub-buckets;
- cluster lease: `ClusterStore(global_mode="lease")`, if this checkout's ClusterStore takes
  that option (found by its signature: nothing to add here when it lands).

Workload: 1,000 users in 100 teams (user i in team i mod 100) and one global key, users
drawn at random; limits so large that every decision is allowed (the denial path is not
measured). The stores get a 1 s timeout (--timeout), not the service's 50 ms: on a shared
2-core host a 50 ms wait trips now and then, the breaker opens, and the decisions that then
fail open cost nothing and would count as fast ones (any that still do are not counted).
For each run: the server-side CPU per decision (utime + stime from /proc/<pid>/stat of every
redis-server of that deployment), the client processes' CPU per decision, the script's own
time per call (INFO commandstats: cmdstat_fcall or cmdstat_evalsha, whichever the store
sent), and the cores other processes used meanwhile.

Part 2, the ceiling of one node. The script call each store really sends is captured off
redis-py's socket writes during one decision (so it follows the store's argument format and
its choice of FCALL or EVALSHA), with `__rand_int__` in the user's key, and replayed with
`redis-benchmark -c 50 -P 1 -r 1000`: the cluster store's call against the primary that owns
its slot; the same keys and argument as FCALL of the single store's function library, on that
primary (when the two stores differ there); the single store's call against the plain server;
and, for comparison, EVALSHA of `return 1` with the same keys and argument. The
redis-server's CPU over each run gives the calls one fully busy core makes per second (on 2
shared cores redis-benchmark and the server compete, so the rate alone understates it).
Last, the arithmetic of docs/SCALING.md's model with this run's figures.

Part 3, how much of a global limit each cluster mode lets through (run first): a global
token bucket of 1,600 that never refills, 4 stores standing for 4 worker processes (each
with its own leased slices), 16 threads sending 4,800 decisions at once, from 100 teams
evenly, 80 % from one team, or all from one team. What each mode admits of the 1,600.

Run: .venv/bin/python bench/cluster.py [--processes P] [--threads T] [--duration D]
     [--rounds R] [--replicas N] [--timeout S] [--requests N] [--ceiling-rounds R]
     [--share-stores N] [--only-shares]
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import math
import multiprocessing
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis  # noqa: E402
from redis.connection import AbstractConnection  # noqa: E402

from core import HierarchicalLimiter  # noqa: E402
from core.stores import store_from_url  # noqa: E402
from core.stores.cluster import ClusterStore  # noqa: E402

USERS, TEAMS = 1000, 100
# Large enough that every decision is allowed, also when redis-benchmark sends ~50,000 a
# second on one user key range, and on one of 16 global sub-buckets.
LIMITS = {"user": (1e7, 1e7), "team": (1e8, 1e8), "global": (1e10, 1e10)}
CONFIG = {level: [{"type": "token_bucket", "capacity": c, "per_second": r}] for level, (c, r) in LIMITS.items()}
TICKS = os.sysconf("SC_CLK_TCK")
WARM_UP = 1.0  # seconds of each run not counted: connections open, threads get going
TRIVIAL = "return 1"
TARGET, HEADROOM = 1_000_000, 0.6  # the scaling model: decisions/s, share of a node's ceiling used


def contenders() -> dict[str, tuple[str, dict]]:
    """name -> (deployment, store options). The lease mode joins when ClusterStore has it."""
    found = {"single Redis": ("single", {}), "cluster split": ("cluster", {})}
    if "global_mode" in inspect.signature(ClusterStore.__init__).parameters:
        found["cluster split"] = ("cluster", {"global_mode": "split"})  # lease is the default now
        found["cluster lease"] = ("cluster", {"global_mode": "lease"})
    return found


# --- servers ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """One redis-server of ours on a free loopback port: no RDB, no AOF."""

    def __init__(self, workdir: str, options: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.directory = os.path.join(workdir, str(self.port))
        os.makedirs(self.directory)
        self.process = subprocess.Popen(
            [
                "/usr/bin/redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.directory,
                "--daemonize",
                "no",
                "--logfile",
                os.path.join(self.directory, "redis.log"),
                *options,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._admin: redis.Redis | None = None

    def client(self) -> redis.Redis:
        """This script's own connection to the server, for admin commands."""
        if self._admin is None:
            self._admin = redis.Redis(port=self.port, socket_timeout=5.0, socket_connect_timeout=5.0)
        return self._admin

    def wait(self) -> Server:
        client = redis.Redis(port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        while True:
            if self.process.poll() is not None:
                log = open(os.path.join(self.directory, "redis.log")).read()[-2000:]
                raise SystemExit(f"redis-server on port {self.port} exited:\n{log}")
            with contextlib.suppress(redis.RedisError):
                if client.ping():
                    client.close()
                    return self
            if time.monotonic() > deadline:
                raise SystemExit(f"redis-server on port {self.port} did not answer PING in 10 s")
            time.sleep(0.02)

    def cpu(self) -> float:
        """Seconds of CPU, user and system, so far."""
        with open(f"/proc/{self.process.pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / TICKS

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Deployment:
    """The redis-servers behind one URL: `primaries` take the calls, `servers` is all of them."""

    def __init__(self, url: str, primaries: list[Server], servers: list[Server]) -> None:
        self.url, self.primaries, self.servers = url, primaries, servers

    def cpu(self) -> float:
        return sum(server.cpu() for server in self.servers)

    def reset_stats(self) -> None:
        for server in self.primaries:
            server.client().config_resetstat()

    def script_stats(self) -> tuple[str, list[int], int]:
        """(the command, calls per primary, microseconds in all) of the script calls."""
        names, calls, usec = set(), [], 0
        for server in self.primaries:
            stats = server.client().info("commandstats")
            found = 0
            for name in ("cmdstat_fcall", "cmdstat_evalsha"):
                if stats.get(name, {}).get("calls"):
                    names.add(name.removeprefix("cmdstat_").upper())
                    found += stats[name]["calls"]
                    usec += stats[name]["usec"]
            calls.append(found)
        return "+".join(sorted(names)) or "-", calls, usec


@contextlib.contextmanager
def deployments(replicas: int) -> Iterator[dict[str, Deployment]]:
    """A plain redis-server and a cluster of 3 primaries (and `replicas` replicas each);
    every process is stopped on the way out, whatever happened."""
    workdir = tempfile.mkdtemp(prefix="bench-cluster-")
    started: list[Server] = []
    try:
        single = Server(workdir)
        started.append(single)
        nodes = []
        for _ in range(3 * (1 + replicas)):
            nodes.append(
                Server(
                    workdir,
                    (
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-port",
                        str(free_port()),
                        "--cluster-node-timeout",
                        "5000",
                        "--repl-diskless-sync-delay",
                        "0",
                        "--cluster-require-full-coverage",
                        "no",
                    ),
                )
            )
            started.append(nodes[-1])
        for server in started:
            server.wait()
        created = subprocess.run(
            [
                "/usr/bin/redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in nodes),
                "--cluster-replicas",
                str(replicas),
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if created.returncode:
            raise SystemExit(f"redis-cli --cluster create failed:\n{created.stdout}\n{created.stderr}")
        wait_for_cluster(nodes)
        primaries = [n for n in nodes if n.client().execute_command("ROLE")[0] == b"master"]
        yield {
            "single": Deployment(f"redis://127.0.0.1:{single.port}/0", [single], [single]),
            "cluster": Deployment(
                "redis-cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in nodes), primaries, nodes
            ),
        }
    finally:
        for server in started:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def wait_for_cluster(nodes: list[Server]) -> None:
    """Until every node says cluster_state:ok with every slot, and replicas are in sync."""
    deadline = time.monotonic() + 30
    while True:
        ready = []
        for node in nodes:
            client = node.client()
            info = client.execute_command("CLUSTER", "INFO")
            replication = client.info("replication")
            ready.append(
                b"cluster_state:ok" in info
                and b"cluster_slots_ok:16384" in info
                and (replication["role"] == "master" or replication.get("master_link_status") == "up")
            )
        if all(ready):
            return
        if time.monotonic() > deadline:
            raise SystemExit("the cluster did not come up within 30 s")
        time.sleep(0.05)


def machine_cpu() -> tuple[float, float]:
    """(busy, idle) seconds of every core so far, from /proc/stat."""
    with open("/proc/stat") as stat:
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, stat.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / TICKS, (idle + iowait) / TICKS


# --- client processes --------------------------------------------------------------------------


def workload(seed: int, n: int = 20_000) -> list[dict]:
    rng = random.Random(seed)
    picks = [rng.randrange(USERS) for _ in range(n)]
    return [{"user": f"user-{i}", "team": f"team-{i % TEAMS}", "global": "*"} for i in picks]


def client_process(pipe, threads: int, stores: dict[str, tuple[str, dict]], timeout: float, seed: int) -> None:
    """One client process: a limiter per contender, then runs on command until told None."""
    limiters = {
        name: HierarchicalLimiter.from_config(CONFIG, store=store_from_url(url, timeout=timeout, **options))
        for name, (url, options) in stores.items()
    }
    for limiter in limiters.values():  # connect, load the script, learn the cluster's slots
        if not limiter.acquire({"user": "user-0", "team": "team-0", "global": "*"}).allowed:
            raise SystemExit("the warm-up decision was denied")
    pipe.send("ready")
    while (order := pipe.recv()) is not None:
        name, start, stop = order
        pipe.send(run_threads(limiters[name].acquire, threads, start, stop, seed))


def run_threads(acquire, threads: int, start: float, stop: float, seed: int) -> dict:
    """`threads` closed loops until `stop`; what they did between `start` and `stop`, and
    this process's CPU seconds in that window."""
    tallies: list = [None] * threads
    workers = [
        threading.Thread(target=closed_loop, args=(acquire, workload(seed * 100 + k), start, stop, tallies, k))
        for k in range(threads)
    ]
    for worker in workers:
        worker.start()
    time.sleep(max(0.0, start - time.monotonic()))
    cpu0 = time.process_time()
    time.sleep(max(0.0, stop - time.monotonic()))
    cpu1 = time.process_time()
    for worker in workers:
        worker.join()
    decisions, admitted, degraded = (sum(column) for column in zip(*tallies))
    return {"decisions": decisions, "admitted": admitted, "degraded": degraded, "cpu": cpu1 - cpu0}


def closed_loop(acquire, requests: list[dict], start: float, stop: float, tallies: list, k: int) -> None:
    now, size, i = time.monotonic, len(requests), 0
    while now() < start:  # warm-up, not counted
        acquire(requests[i % size])
        i += 1
    decisions = admitted = degraded = 0
    while now() < stop:
        decision = acquire(requests[i % size])
        i += 1
        decisions += 1
        admitted += decision.allowed
        degraded += decision.degraded
    tallies[k] = (decisions, admitted, degraded)


class Clients:
    """P spawned client processes, each with a limiter per contender."""

    def __init__(self, processes: int, threads: int, stores: dict[str, tuple[str, dict]], timeout: float) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipes, self.processes = [], []
        for p in range(processes):
            ours, theirs = context.Pipe()
            process = context.Process(
                target=client_process, args=(theirs, threads, stores, timeout, p + 1), daemon=True
            )
            process.start()
            self.pipes.append(ours)
            self.processes.append(process)
        for pipe, process in zip(self.pipes, self.processes):
            if not pipe.poll(120) or pipe.recv() != "ready":
                raise SystemExit(f"client process {process.pid} did not get ready")

    def start(self, name: str, start: float, stop: float) -> None:
        for pipe in self.pipes:
            pipe.send((name, start, stop))

    def results(self) -> list[dict]:
        return [pipe.recv() for pipe in self.pipes]

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        for process in self.processes:
            process.join(5)
            if process.is_alive():
                process.terminate()
                process.join()


def one_run(clients: Clients, name: str, deployment: Deployment, duration: float) -> dict:
    """One contender for `duration` seconds (after the warm-up), everything measured."""
    deployment.reset_stats()
    start = time.monotonic() + WARM_UP
    stop = start + duration
    clients.start(name, start, stop)
    time.sleep(start - time.monotonic())
    server0, (busy0, idle0) = deployment.cpu(), machine_cpu()
    time.sleep(max(0.0, stop - time.monotonic()))
    server1, (busy1, idle1) = deployment.cpu(), machine_cpu()
    tallies = clients.results()
    command, calls, usec = deployment.script_stats()
    # Only decisions that reached Redis count: a degraded one (failed open after a timeout, or
    # at once while the breaker is open) costs next to nothing and measures nothing here.
    degraded = sum(t["degraded"] for t in tallies)
    decisions = sum(t["decisions"] for t in tallies) - degraded
    client_cpu, server_cpu = sum(t["cpu"] for t in tallies), server1 - server0
    return {
        "rate": decisions / duration,
        "decisions": decisions,
        "degraded": degraded,
        "admitted": sum(t["admitted"] for t in tallies) - degraded,
        "client_us": client_cpu / decisions * 1e6,
        "server_us": server_cpu / decisions * 1e6,
        "server_cores": server_cpu / duration,
        "client_cores": client_cpu / duration,
        "other_cores": max(0.0, (busy1 - busy0 - server_cpu - client_cpu) / duration),
        "idle_cores": (idle1 - idle0) / duration,
        "command": command,
        "script_us": usec / sum(calls) if sum(calls) else float("nan"),
        "shares": [c / sum(calls) for c in calls] if sum(calls) else [],
    }


def race(found: dict[str, Deployment], args) -> dict[str, list[dict]]:
    names = contenders()
    stores = {name: (found[where].url, options) for name, (where, options) in names.items()}
    print(
        f"Part 1: {args.processes} client processes x {args.threads} threads, closed loop, "
        f"{WARM_UP:.0f} s warm-up + {args.duration:g} s per run, {args.rounds} rounds; "
        f"contenders: {', '.join(names)}"
    )
    if "cluster lease" not in names:
        print("  (ClusterStore takes no global_mode yet: no 'cluster lease' contender)")
    print_layout(found["cluster"])
    print(
        f"{'round':>5} {'contender':14} {'decisions/s':>11} {'client us':>9} {'server us':>9} "
        f"{'script us':>14} {'calls per primary':>18} {'degraded':>8} {'other/idle cores':>16}"
    )
    rounds: dict[str, list[dict]] = {name: [] for name in names}
    clients = Clients(args.processes, args.threads, stores, args.timeout)
    try:
        order = list(names)
        for r in range(args.rounds):
            for name in order[r % len(order) :] + order[: r % len(order)]:
                run = one_run(clients, name, found[names[name][0]], args.duration)
                rounds[name].append(run)
                shares = " / ".join(f"{s:.0%}" for s in run["shares"]) if len(run["shares"]) > 1 else ""
                print(
                    f"{r + 1:5} {name:14} {run['rate']:11,.0f} {run['client_us']:9.1f} {run['server_us']:9.1f}"
                    f" {run['command']:>7} {run['script_us']:6.1f} {shares:>18} {run['degraded']:8}"
                    f" {run['other_cores']:7.2f}/{run['idle_cores']:.2f}",
                    flush=True,
                )
                if run["admitted"] != run["decisions"]:
                    print(f"      {run['decisions'] - run['admitted']} decisions denied: the limits are too small")
    finally:
        clients.close()
    return rounds


def print_layout(cluster: Deployment) -> None:
    """Which primary each shard's hash tag lands on, and the share of this workload's
    decisions each primary should get (teams to shards by crc32, users uniform)."""
    client = redis.RedisCluster(host="127.0.0.1", port=cluster.primaries[0].port)
    shards = inspect.signature(ClusterStore.__init__).parameters["shards"].default
    owner = {}
    for s in range(shards):
        owner[s] = client.get_node_from_key(f"{{s{s}}}").port
    ports = [server.port for server in cluster.primaries]
    share = [0] * len(ports)
    for team in range(TEAMS):
        share[ports.index(owner[zlib.crc32(f"team-{team}".encode()) % shards])] += 1
    tags = [sum(1 for s in range(shards) if owner[s] == port) for port in ports]
    print(
        f"  cluster: {shards} shard tags over {len(ports)} primaries: {' / '.join(map(str, tags))} tags,"
        f" {' / '.join(f'{n / TEAMS:.0%}' for n in share)} of the teams (so of the decisions)"
    )
    client.close()


# --- part 2: the ceiling of one node ---------------------------------------------------------


@contextlib.contextmanager
def captured() -> Iterator[list[list[bytes]]]:
    """Every command redis-py writes to a socket meanwhile, parsed back into its arguments."""
    commands: list[list[bytes]] = []
    original = AbstractConnection.send_packed_command

    def send(self, command, check_health=True):
        chunks = [command] if isinstance(command, (bytes, str)) else command
        commands.append(parse_resp(b"".join(bytes(c) if not isinstance(c, str) else c.encode() for c in chunks)))
        return original(self, command, check_health)

    AbstractConnection.send_packed_command = send
    try:
        yield commands
    finally:
        AbstractConnection.send_packed_command = original


def parse_resp(data: bytes) -> list[bytes]:
    """The arguments of one RESP array of bulk strings (what a client sends)."""
    if not data.startswith(b"*"):
        return [data]
    head, _, rest = data.partition(b"\r\n")
    args = []
    for _ in range(int(head[1:])):
        length, _, rest = rest.partition(b"\r\n")
        size = int(length[1:])
        args.append(rest[:size])
        rest = rest[size + 2 :]
    return args


def script_call(url: str) -> tuple[list[bytes], Any]:
    """The script call a store sends for one decision of a user named `user-__rand_int__`,
    and the store (still open, so the caller can find where its keys live)."""
    store = store_from_url(url)
    limiter = HierarchicalLimiter.from_config(CONFIG, store=store)
    keys = {"user": "user-__rand_int__", "team": "team-7", "global": "*"}
    limiter.acquire(keys)  # the library or script is loaded now; the next call is the plain one
    with captured() as commands:
        if not limiter.acquire(keys).allowed:
            raise SystemExit("the captured decision was denied")
    calls = [c for c in commands if c and c[0].upper() in (b"FCALL", b"EVALSHA")]
    if len(calls) != 1:
        raise SystemExit(f"expected one script call per decision, saw {[c[:2] for c in commands]}")
    return calls[0], store


def redis_benchmark(server: Server, command: list[bytes], requests: int) -> dict:
    """redis-benchmark -c 50 -P 1 -r 1000 of `command` against `server`, with the server's CPU."""
    cpu0, t0 = server.cpu(), time.monotonic()
    done = subprocess.run(
        [
            "/usr/bin/redis-benchmark",
            "-p",
            str(server.port),
            "-n",
            str(requests),
            "-c",
            "50",
            "-P",
            "1",
            "-r",
            "1000",
            "--csv",
            *map(os.fsdecode, command),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds, cpu = time.monotonic() - t0, server.cpu() - cpu0
    lines = [line for line in done.stdout.splitlines() if line and not line.startswith('"test"')]
    if done.returncode or not lines:
        raise SystemExit(f"redis-benchmark failed:\n{done.stdout}\n{done.stderr}")
    rate = float(lines[-1].split('","')[1])
    return {
        "rate": rate,
        "server_cores": cpu / seconds,
        "per_core": requests / cpu if cpu else float("nan"),
        "cpu_us": cpu / requests * 1e6,
    }


def ceiling(found: dict[str, Deployment], args) -> dict[str, list[dict]]:
    """redis-benchmark of our script call, as each store sends it, and of a trivial one."""
    cluster_call, cluster_store = script_call(found["cluster"].url)
    single_call, single_store = script_call(found["single"].url)
    # The primary that owns the cluster call's slot: every run there uses the same keys.
    port = int(cluster_store.node_of(os.fsdecode(cluster_call[3])).rpartition(":")[2])
    primary = next(s for s in found["cluster"].primaries if s.port == port)
    single = found["single"].primaries[0]
    keys_and_argument = cluster_call[2:]
    runs = {
        f"cluster store's call ({cluster_call[0].decode().upper()}), on a primary": (primary, cluster_call),
        f"single store's call ({single_call[0].decode().upper()}), on the plain server": (single, single_call),
    }
    library = getattr(single_store, "library_source", None)
    if single_call[0].upper() == b"FCALL" and cluster_call[0].upper() != b"FCALL" and library:
        # What the cluster store would cost as a function library, as the single store sends it.
        primary.client().execute_command("FUNCTION", "LOAD", "REPLACE", library)
        runs["cluster store's keys as FCALL, on a primary"] = (primary, [b"FCALL", single_call[1], *keys_and_argument])
    trivial = [b"EVALSHA", primary.client().script_load(TRIVIAL).encode(), *keys_and_argument]
    runs[f"trivial '{TRIVIAL}' (EVALSHA), same keys and argument, on a primary"] = (primary, trivial)
    cluster_store.close()
    single_store.close()
    print(
        f"\nPart 2: redis-benchmark -n {args.requests:,} -c 50 -P 1 -r 1000, {args.ceiling_rounds} rounds"
        " interleaved; the redis-server's CPU over each run. The commands:"
    )
    for name, (_, call) in runs.items():
        print(f"  {name}:\n    {' '.join(os.fsdecode(a) for a in call[:-1])} {os.fsdecode(call[-1])!r}")
    for name, (server, call) in runs.items():  # each answers as an allowed decision (or 1), not an error
        reply = server.client().execute_command(*(arg.replace(b"__rand_int__", b"0") for arg in call))
        if isinstance(reply, list):
            raise SystemExit(f"{name}: denied, {reply}; the limits are too small")
    results: dict[str, list[dict]] = {name: [] for name in runs}
    for r in range(args.ceiling_rounds):
        for name, (server, call) in runs.items():
            run = redis_benchmark(server, call, args.requests)
            results[name].append(run)
            print(
                f"  {r + 1} {name[:44]:44} {run['rate']:9,.0f} calls/s, server {run['server_cores']:.2f} cores,"
                f" {run['cpu_us']:5.1f} us CPU per call -> {run['per_core']:9,.0f} per core-second",
                flush=True,
            )
    return results


# --- report ----------------------------------------------------------------------------------

# --- part 3: how much of a global limit each mode lets through ------------------------------

SHARE_LIMIT = 1600  # the global token bucket, no refill: every admission is one of these
PATTERNS = {
    "even over 100 teams": lambda n: f"team-{n % 100}",
    "80 % from one team": lambda n: "busy-team" if n % 5 else f"team-{n % 100}",
    "one team": lambda n: "busy-team",
}


def shares(found: dict[str, Deployment], args) -> dict[str, dict[str, int]]:
    """For each cluster mode and traffic pattern: `args.share_stores` stores (standing for
    worker processes, each with its own leased slices) of 4 threads each send 3 x SHARE_LIMIT
    decisions at once; how many of the global SHARE_LIMIT were admitted."""
    config = {"team": CONFIG["team"], "global": [{"type": "token_bucket", "capacity": SHARE_LIMIT, "per_second": 0}]}
    results: dict[str, dict[str, int]] = {}
    for name, (deployment, options) in contenders().items():
        if deployment != "cluster":
            continue
        results[name] = {}
        for label, team_of in PATTERNS.items():
            prefix = f"share{zlib.crc32((name + label).encode())}"
            stores = [
                store_from_url(found["cluster"].url, timeout=args.timeout, prefix=prefix, **options)
                for _ in range(args.share_stores)
            ]
            limiters = [HierarchicalLimiter.from_config(config, store=store) for store in stores]
            counter = iter(range(3 * SHARE_LIMIT))
            admitted = [0]
            lock = threading.Lock()

            def work(limiter, counter=counter, team_of=team_of, lock=lock, admitted=admitted) -> None:
                for n in counter:  # the iterator is shared: each decision is taken once
                    decision = limiter.acquire({"team": team_of(n), "global": "*"})
                    if decision.allowed:
                        with lock:
                            admitted[0] += 1

            threads = [
                threading.Thread(target=work, args=(limiters[k % len(limiters)],)) for k in range(4 * len(limiters))
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            results[name][label] = admitted[0]
            for store in stores:
                store.close()
    return results


def report_shares(results: dict[str, dict[str, int]]) -> None:
    print(f"Part 3, admitted of a global {SHARE_LIMIT:,} (no refill) by {3 * SHARE_LIMIT:,} decisions at once:")
    for name, by_pattern in results.items():
        print(
            "  " + name + ": " + "; ".join(f"{label} {n:,} ({n / SHARE_LIMIT:.0%})" for label, n in by_pattern.items())
        )


def spread(values: list[float], digits: int = 0, suffix: str = "") -> str:
    middle = statistics.median(values)
    return f"{middle:,.{digits}f}{suffix} ({min(values):,.{digits}f} - {max(values):,.{digits}f})"


def report(rounds: dict[str, list[dict]], ceilings: dict[str, list[dict]]) -> None:
    print(
        "\nPart 1, median round (min - max); 'by CPU': the single store's client + server CPU per"
        " decision over this one's, round by round"
    )
    base = rounds["single Redis"]
    for name, runs in rounds.items():
        ratios = [run["rate"] / ref["rate"] for run, ref in zip(runs, base)]
        by_cpu = [
            (ref["client_us"] + ref["server_us"]) / (run["client_us"] + run["server_us"])
            for run, ref in zip(runs, base)
        ]
        decisions, degraded = sum(r["decisions"] for r in runs), sum(r["degraded"] for r in runs)
        print(
            f"  {name}: {spread([r['rate'] for r in runs])} decisions/s, {spread(ratios, 2, 'x')} of single"
            f" (by CPU {spread(by_cpu, 2, 'x')})\n"
            f"    CPU us per decision: client {spread([r['client_us'] for r in runs], 1)},"
            f" server {spread([r['server_us'] for r in runs], 1)}; inside {runs[0]['command']}"
            f" {spread([r['script_us'] for r in runs], 1)} us per call\n"
            f"    {decisions:,} decisions counted, {degraded:,} degraded (not counted); other processes used up to"
            f" {max(r['other_cores'] for r in runs):.2f} cores"
        )
    if not ceilings:
        return
    print("Part 2, median round (min - max):")
    for name, runs in ceilings.items():
        print(
            f"  {name}: {spread([r['rate'] for r in runs])} calls/s at {spread([r['server_cores'] for r in runs], 2)}"
            f" server cores; {spread([r['per_core'] for r in runs])} calls per core-second of redis-server"
        )
    model(rounds, ceilings)


def model(rounds: dict[str, list[dict]], ceilings: dict[str, list[dict]]) -> None:
    """Primaries and client cores for TARGET decisions/s, each primary at HEADROOM of the
    ceiling of one core for the call it gets (see docs/SCALING.md for the caveats)."""
    print(f"Model for {TARGET:,} decisions/s, primaries at {HEADROOM:.0%} of one core's ceiling:")
    for name, runs in ceilings.items():
        if name.startswith("trivial"):
            continue
        per_core = statistics.median(r["per_core"] for r in runs)
        needed = TARGET / (per_core * HEADROOM)
        print(f"  {name}: {TARGET:,} / ({per_core:,.0f} x {HEADROOM}) = {needed:.1f}, so {math.ceil(needed)} primaries")
    for name, runs in rounds.items():
        client_us = statistics.median(r["client_us"] for r in runs)
        print(f"  client CPU, {name}: {TARGET:,} x {client_us:.1f} us = {TARGET * client_us / 1e6:.1f} cores")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2, help="client processes")
    parser.add_argument("--threads", type=int, default=4, help="threads per client process")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds counted per run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--replicas", type=int, default=0, help="replicas per cluster primary")
    parser.add_argument(
        "--timeout",
        type=float,
        default=1.0,
        help="the stores' timeout, s (the service's default, 0.05, trips on a busy 2-core host)",
    )
    parser.add_argument("--requests", type=int, default=50_000, help="per redis-benchmark run")
    parser.add_argument("--ceiling-rounds", type=int, default=3, help="redis-benchmark rounds (0: skip)")
    parser.add_argument(
        "--share-stores", type=int, default=4, help="part 3: stores standing for worker processes (0: skip part 3)"
    )
    parser.add_argument("--only-shares", action="store_true", help="run part 3 alone")
    args = parser.parse_args()
    print(
        f"Python {sys.version.split()[0]}, redis-py {redis.__version__}, "
        f"{subprocess.run(['/usr/bin/redis-server', '--version'], capture_output=True, text=True).stdout.split()[2]},"
        f" {os.cpu_count()} cores"
    )
    with deployments(args.replicas) as found:
        share_results = shares(found, args) if args.share_stores else {}
        if args.only_shares:
            report_shares(share_results)
            return
        rounds = race(found, args)
        ceilings = ceiling(found, args) if args.ceiling_rounds else {}
    report(rounds, ceilings)
    if share_results:
        report_shares(share_results)


if __name__ == "__main__":
    main()
