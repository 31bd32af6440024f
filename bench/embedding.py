"""What the `limit` decorator (policies/embedding.py) costs a request, against the same view
unprotected, sync and async, side by side in one run:

- **the view call**: the view called directly with a request made once (RequestFactory), a
  plain `HttpResponse` view, and the same view under `@limit(rate=...)` with a limit no
  request reaches (every decision allowed, as most are), 1,000 clients in turn: the
  decorator's own cost (keys, the decision, the header fields, the record) against a view
  that does nothing;
- **through Django**: the same views through Django's handler and the app's middleware
  (the test Client, AsyncClient for the async views: no network), what a request costs
  before the view's own work.

Each on the in-process store (this process's memory) and on Redis (one FCALL a decision;
the async views on redis-py's asyncio client). Without --url it starts its own redis-server
on a free loopback port. Each pair (unprotected, decorated) runs R rounds interleaved; the best
round of each counts, and the ratio is decorated / unprotected.

Run: .venv/bin/python bench/embedding.py [--calls N] [--rounds R] [--url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The checkout, in place of bench/ itself: bench/http.py would hide the standard library's http.
sys.path[0] = ROOT

CLIENTS = 1000
NEVER_REACHED = {"rate": 1e9, "burst": 1e12}  # every decision allowed


def measure(calls: int, rounds: int) -> dict:
    """The figures on the store this process's settings give (REDIS_URL or not)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()
    from asgiref.sync import async_to_sync
    from django.http import HttpResponse
    from django.test import AsyncClient, Client, RequestFactory

    from policies.embedding import limit
    from policies.stores import limiter_store

    def plain(request):
        return HttpResponse(b"ok")

    async def plain_async(request):
        return HttpResponse(b"ok")

    limited = limit(**NEVER_REACHED)(plain)
    limited_async = limit(**NEVER_REACHED)(plain_async)
    factory = RequestFactory()
    requests = [factory.get("/", REMOTE_ADDR=f"10.0.{i // 256}.{i % 256}") for i in range(CLIENTS)]

    def sync_calls(view) -> float:
        started = time.perf_counter()
        for i in range(calls):
            view(requests[i % CLIENTS])
        return (time.perf_counter() - started) / calls

    loop = asyncio.new_event_loop()

    async def async_loop(view) -> float:
        started = time.perf_counter()
        for i in range(calls):
            await view(requests[i % CLIENTS])
        return (time.perf_counter() - started) / calls

    def async_calls(view) -> float:
        return loop.run_until_complete(async_loop(view))

    client, async_client = Client(), AsyncClient()
    through = max(1, calls // 10)

    def client_calls(path: str) -> float:
        started = time.perf_counter()
        for i in range(through):
            answer = client.get(path, REMOTE_ADDR=f"10.1.{i % 250}.1")
        assert answer.status_code == 200, (path, answer.status_code)
        return (time.perf_counter() - started) / through

    async def async_client_loop(path: str) -> float:
        started = time.perf_counter()
        for i in range(through):
            answer = await async_client.get(path, REMOTE_ADDR=f"10.1.{i % 250}.1")
        assert answer.status_code == 200, (path, answer.status_code)
        return (time.perf_counter() - started) / through

    def async_client_calls(path: str) -> float:
        return async_to_sync(async_client_loop)(path)

    pairs = {
        "view call, sync": (lambda: sync_calls(plain), lambda: sync_calls(limited)),
        "view call, async": (lambda: async_calls(plain_async), lambda: async_calls(limited_async)),
        "through Django, sync": (lambda: client_calls("/bench/open"), lambda: client_calls("/bench/limited")),
        "through Django, async": (
            lambda: async_client_calls("/bench/open-async"),
            lambda: async_client_calls("/bench/limited-async"),
        ),
    }
    for bare, decorated in pairs.values():  # warm: plans made, connections open
        bare(), decorated()
    best: dict[str, list[float]] = {name: [float("inf"), float("inf")] for name in pairs}
    for _ in range(rounds):
        for name, (bare, decorated) in pairs.items():
            best[name][0] = min(best[name][0], bare())
            best[name][1] = min(best[name][1], decorated())
    loop.close()
    return {"store": limiter_store().name, "figures": best}


def child(url: str | None, calls: int, rounds: int) -> dict:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", "ALLOWED_HOSTS": "testserver"}
    env.pop("REDIS_URL", None)
    if url:
        env["REDIS_URL"] = url
    done = subprocess.run(
        [sys.executable, __file__, "--child", "--calls", str(calls), "--rounds", str(rounds)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(result: dict) -> None:
    print(f"\n{result['store']}")
    print(f"  {'':24} {'unprotected':>12} {'@limit':>12} {'added':>10} {'ratio':>7}")
    for name, (bare, decorated) in result["figures"].items():
        print(
            f"  {name:24} {bare * 1e6:>10.1f}us {decorated * 1e6:>10.1f}us"
            f" {(decorated - bare) * 1e6:>8.1f}us {decorated / bare:>6.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--url", help="a Redis to use (default: our own redis-server)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.calls, args.rounds)))
        return
    from bench.redis_store import redis_server

    print(f"{args.calls} view calls ({args.calls // 10} through Django) a round, best of {args.rounds} rounds")
    report(child(None, args.calls, args.rounds))
    with redis_server(args.url) as url:
        report(child(url, args.calls, args.rounds))


if __name__ == "__main__":
    main()
