"""What the LiteLLM hook (core/litellm_hook.py) adds to a call: LiteLLM's proxy from
docs/LLM_GATEWAYS.md's configuration, with the hook and without it, side by side in one run,
in front of the real service (gunicorn, a fresh SQLite database, its own redis-server).

Each round sends --calls chat completions one after another (max_tokens 50, a model that
LiteLLM answers itself after no delay) to a proxy of one worker, and times each from the
request's first byte to the answer's last. With the hook a call reserves before it runs and
commits after (two requests to the API, in the call's path), and its prompt is counted.
A third proxy has a callback that does nothing (bench/litellm_noop.py): LiteLLM does more
work for a call once any callback is configured, and that part is LiteLLM's, not the hook's.
Rounds alternate (each goes first in turn) and every round is printed; the summary gives the
median round's p50 and p99 of each, and their differences: what the hook adds.

Run: .venv/bin/python bench/litellm.py [--calls N] [--rounds R] [--warmup N]
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = ROOT
elif ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

from bench.redis_store import redis_server  # noqa: E402
from tests.gateways.llm_proxy import LiteLLM  # noqa: E402
from tests.serving import Service  # noqa: E402

POLICY = {
    "default_tier": "t",
    "levels": [{"name": "user"}, {"name": "team"}, {"name": "global"}],
    # Out of reach: every call is allowed, so both sides do the same work upstream.
    "tiers": {"t": {"team": [{"type": "token_bucket", "capacity": 10**12, "per_second": 10**9}]}},
}
CALL = {"messages": [{"role": "user", "content": "What is a token bucket, in one sentence?"}], "max_tokens": 50}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def round_of(proxy: LiteLLM, calls: int, warmup: int) -> list[float]:
    """Milliseconds of each of `calls` calls, after `warmup` untimed ones."""
    times = []
    for i in range(warmup + calls):
        start = time.perf_counter()
        status, _, body = proxy.chat(CALL, team=f"team-{i % 50}", user=f"user-{i % 1000}")
        elapsed = (time.perf_counter() - start) * 1000
        if status != 200:
            raise RuntimeError(f"a call failed: {status} {body}")
        if i >= warmup:
            times.append(elapsed)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4, help="rounds of each, alternating")
    parser.add_argument("--warmup", type=int, default=30)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {"hook": [], "noop": [], "none": []}
    with redis_server(None) as url, Service(POLICY, redis_url=url, workers=1) as service:
        proxies = {
            "hook": LiteLLM(service),
            "noop": LiteLLM(service, callback="bench.litellm_noop.noop"),
            "none": LiteLLM(service, callback=None),
        }
        with proxies["hook"], proxies["noop"], proxies["none"]:
            order = list(proxies)
            for number in range(args.rounds):
                for name in order if number % 2 == 0 else order[::-1]:
                    times = round_of(proxies[name], args.calls, args.warmup)
                    p50, p99 = statistics.median(times), percentile(times, 0.99)
                    results[name].append((p50, p99))
                    print(f"round {number + 1} {name:>4}: p50 {p50:6.2f} ms  p99 {p99:6.2f} ms", flush=True)
    summary = {name: sorted(rounds)[len(rounds) // 2] for name, rounds in results.items()}
    (hook50, hook99), (noop50, noop99), (none50, none99) = summary["hook"], summary["noop"], summary["none"]
    print(f"\nno callback:          p50 {none50:.2f} ms, p99 {none99:.2f} ms")
    print(f"a callback doing nothing: p50 {noop50:.2f} ms, p99 {noop99:.2f} ms")
    print(f"our hook:             p50 {hook50:.2f} ms, p99 {hook99:.2f} ms")
    print(f"our hook adds:        p50 {hook50 - none50:+.2f} ms, p99 {hook99 - none99:+.2f} ms")
    print(f"of which LiteLLM's for any callback: p50 {noop50 - none50:+.2f} ms, p99 {noop99 - none99:+.2f} ms")


if __name__ == "__main__":
    main()
