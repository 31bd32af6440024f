"""The asyncio client's HTTP library, chosen by measuring: decisions per second and the client's
CPU per decision of three candidates, side by side in one run, against the real service
(gunicorn, `-c python:limiter_admin.gunicorn_conf`, a fresh SQLite database, its own
redis-server) on loopback:

- streams: core.client.AsyncLimiterClient itself, on asyncio streams (no dependency);
- httpx: `httpx.AsyncClient` (pinned in requirements-dev.txt for this bench);
- aiohttp: `aiohttp.ClientSession` with a `TCPConnector` (the same).

Every candidate sends the same `POST /api/v1/decisions` (bench/http.py's 1,000 users in 50
teams, limits out of reach) from --tasks tasks of one event loop sharing one client of at most
--tasks keep-alive connections, and reads the answer with the same code (core.remote's
read_answer and decision_from_json), so that only the HTTP library differs.

Run: .venv/bin/python bench/async_client.py [--duration S] [--warmup S] [--tasks N]
     [--rounds R] [--workers W] [--threads T] [--loop asyncio|uvloop]
     [--candidates streams,httpx,aiohttp]

The rounds are interleaved (streams, httpx, aiohttp; httpx, aiohttp, streams; ...: each goes
first in turn) and the MEDIAN round counts; every round is printed. Client CPU is this
process's (`time.process_time`: the loop, the library, the parsing), per decision; gunicorn's
and redis-server's come from /proc. The client shares the 2 cores with the server, so a
client that takes more CPU also leaves the server less: decisions/s show that too.
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
import asyncio  # noqa: E402
import gc  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from importlib.metadata import version  # noqa: E402

from bench.http import USERS, keys_of, serve, usage  # noqa: E402
from core.client import AsyncLimiterClient  # noqa: E402
from core.remote import decide_body, decision_from_json, encode, read_answer  # noqa: E402

PATH = "/api/v1/decisions"


class Streams:
    """The candidate that is the client itself."""

    def __init__(self, base: str, token: str, tasks: int) -> None:
        self.client = AsyncLimiterClient(base, token, timeout=10.0, max_connections=tasks)

    async def decide(self, keys: dict):
        return await self.client.decide(keys)

    async def close(self) -> None:
        await self.client.aclose()


class Httpx:
    def __init__(self, base: str, token: str, tasks: int) -> None:
        import httpx  # only this bench needs it

        limits = httpx.Limits(max_connections=tasks, max_keepalive_connections=tasks)
        self.client = httpx.AsyncClient(base_url=base, headers=headers(token), limits=limits, timeout=10.0)

    async def decide(self, keys: dict):
        answer = await self.client.post(PATH, content=encode(decide_body(keys, 1, None, False)))
        return decision_from_json(read_answer(answer.status_code, answer.reason_phrase, answer.content))

    async def close(self) -> None:
        await self.client.aclose()


class Aiohttp:
    def __init__(self, base: str, token: str, tasks: int) -> None:
        import aiohttp  # only this bench needs it

        self.session = aiohttp.ClientSession(
            base_url=base,
            headers=headers(token),
            connector=aiohttp.TCPConnector(limit=tasks),
            timeout=aiohttp.ClientTimeout(total=10.0),
        )

    async def decide(self, keys: dict):
        payload = encode(decide_body(keys, 1, None, False))
        async with self.session.post(PATH, data=payload) as answer:
            raw = await answer.read()
            return decision_from_json(read_answer(answer.status, answer.reason or "", raw))

    async def close(self) -> None:
        await self.session.close()


CANDIDATES = {"streams": Streams, "httpx": Httpx, "aiohttp": Aiohttp}


def headers(token: str) -> dict:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Accept": "application/json"}


async def run(candidate: str, base: str, token: str, args, servers: list[int]) -> dict:
    """--tasks tasks deciding in a closed loop: --warmup seconds, then --duration measured."""
    client = CANDIDATES[candidate](base, token, args.tasks)
    keys = [keys_of(user) for user in range(USERS)]
    counted = {"decisions": 0, "denied": 0}
    measuring = False
    stop = False

    async def work(first: int) -> None:
        i = first
        while not stop:
            decision = await client.decide(keys[i % USERS])
            i += args.tasks
            if measuring:
                counted["decisions"] += 1
                counted["denied"] += not decision.allowed

    tasks = [asyncio.create_task(work(i)) for i in range(args.tasks)]
    await asyncio.sleep(args.warmup)
    gc.collect()
    measuring = True
    cpu0, wall0, server0 = time.process_time(), time.perf_counter(), usage(servers)
    await asyncio.sleep(args.duration)
    measuring = False
    cpu1, wall1, server1 = time.process_time(), time.perf_counter(), usage(servers)
    stop = True
    await asyncio.gather(*tasks)
    await client.close()
    n = max(1, counted["decisions"])
    server_cpu = (server1.user + server1.system) - (server0.user + server0.system)
    return {
        "decisions_s": counted["decisions"] / (wall1 - wall0),
        "client_us": (cpu1 - cpu0) / n * 1e6,
        "server_us": server_cpu / n * 1e6,
        "denied": counted["denied"],
    }


def new_loop(kind: str) -> asyncio.AbstractEventLoop:
    if kind == "uvloop":
        import uvloop  # optional: only with --loop uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def bench(args) -> None:
    from bench.redis_store import redis_server
    from core.stores.redis import connect

    rounds: list[dict] = []
    with redis_server(None) as url, serve(args, url) as service:
        base = f"http://127.0.0.1:{service.port}"
        redis_pid = int(connect(url).info("server")["process_id"])
        servers = [service.process.pid, *service.worker_pids(), redis_pid]
        print(f"{'round':>5} {'candidate':9} {'decisions/s':>12} {'client us':>10} {'server us':>10}")
        for number in range(args.rounds):
            order = args.candidates[number % len(args.candidates) :] + args.candidates[: number % len(args.candidates)]
            found = {}
            for candidate in order:
                loop = new_loop(args.loop)
                try:
                    found[candidate] = loop.run_until_complete(run(candidate, base, service.token, args, servers))
                finally:
                    loop.close()
                r = found[candidate]
                if r["denied"]:
                    raise SystemExit(f"{candidate}: {r['denied']} denials; the limits should be out of reach")
                print(
                    f"{number + 1:5} {candidate:9} {r['decisions_s']:12,.0f} {r['client_us']:10.0f} "
                    f"{r['server_us']:10.0f}"
                )
            rounds.append(found)
    report(rounds, args)


def report(rounds: list[dict], args) -> None:
    libraries = {"httpx": "httpx", "aiohttp": "aiohttp"}
    versions = ", ".join(f"{name} {version(name)}" for name in libraries.values() if name in args.candidates)
    print(
        f"\nmedian of {len(rounds)} interleaved rounds; {args.tasks} tasks on one client, {args.loop} loop; "
        f"gunicorn -w {args.workers} --threads {args.threads}; {args.duration:g} s per run after "
        f"{args.warmup:g} s warm-up; Python {sys.version.split()[0]}, {os.cpu_count()} cores; {versions}"
    )
    peer = args.candidates[0]
    for candidate in args.candidates:
        rate = statistics.median(r[candidate]["decisions_s"] for r in rounds)
        client = statistics.median(r[candidate]["client_us"] for r in rounds)
        server = statistics.median(r[candidate]["server_us"] for r in rounds)
        by_rate = statistics.median(r[candidate]["decisions_s"] / r[peer]["decisions_s"] for r in rounds)
        by_cpu = statistics.median(r[candidate]["client_us"] / r[peer]["client_us"] for r in rounds)
        print(
            f"{candidate:9} {rate:8,.0f} decisions/s ({by_rate:.2f}x {peer}), client CPU {client:5.0f} us "
            f"per decision ({by_cpu:.2f}x {peer}), server CPU {server:5.0f} us"
        )


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=4.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring")
    parser.add_argument("--tasks", type=int, default=16, help="concurrent tasks, and the client's connections")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn -w")
    parser.add_argument("--threads", type=int, default=8, help="gunicorn --threads")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the median counts")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--candidates", default="streams,httpx,aiohttp", help="comma-separated")
    args = parser.parse_args()
    args.candidates = [c.strip() for c in args.candidates.split(",") if c.strip()]
    unknown = set(args.candidates) - set(CANDIDATES)
    if unknown:
        parser.error(f"unknown candidates {sorted(unknown)} (known: {', '.join(CANDIDATES)})")
    return args


if __name__ == "__main__":
    bench(parse_args())
