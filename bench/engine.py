"""Decisions per second of a 3-level decision (user, team, global; one token bucket each),
side by side in one process with:

- the `limits` library's MemoryStorage doing the same three levels as three `hit` calls,
  with its fixed window and its moving window;
- a plain, unlocked reference loop in the style of seed 003 (dict of tuples per rule,
  check every rule, then take from every rule), which is neither thread-safe nor bounded.

Run: .venv/bin/python bench/engine.py [--decisions N] [--rounds R]
Each contender runs R rounds interleaved with the others; the best round counts.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from limits import parse, storage, strategies  # noqa: E402

from core import HierarchicalLimiter, MemoryStore  # noqa: E402

USERS, TEAMS = 1000, 50
LIMITS = {"user": (100, 50), "team": (2000, 1000), "global": (1_000_000, 100_000)}


class ReferenceBucket:
    """Token bucket as seed 003 writes it: state in a dict, refill computed in both phases."""

    def __init__(self, capacity: float, per_second: float) -> None:
        self.capacity, self.rate, self.state = capacity, per_second, {}
        self.name = f"token_bucket({capacity}, {per_second}/s)"

    def _tokens(self, key, now):
        tokens, last = self.state.get(key, (self.capacity, now))
        return min(self.capacity, tokens + (now - last) * self.rate)

    def wait_time(self, key, now, cost):
        missing = cost - self._tokens(key, now)
        return 0.0 if missing <= 0 else missing / self.rate

    def take(self, key, now, cost):
        self.state[key] = (self._tokens(key, now) - cost, now)


class ReferenceLimiter:
    """Check every rule of every level, then take from all; no lock, no eviction."""

    def __init__(self) -> None:
        self.levels = {level: [ReferenceBucket(*LIMITS[level])] for level in LIMITS}

    def acquire(self, keys, now, cost=1.0):
        checks = [(level, rule, keys[level]) for level, rules in self.levels.items()
                  if level in keys for rule in rules]
        worst, blocker = 0.0, None
        for level, rule, key in checks:
            wait = rule.wait_time(key, now, cost)
            if wait > worst:
                worst, blocker = wait, f"{level}: {rule.name}"
        if worst > 0:
            return (False, worst, blocker)
        for level, rule, key in checks:
            rule.take(key, now, cost)
        return (True, 0.0, None)


def workload(n: int) -> list[dict]:
    rng = random.Random(7)
    users = [(f"user-{i}", f"team-{i % TEAMS}") for i in range(USERS)]
    picks = [users[rng.randrange(USERS)] for _ in range(n)]
    return [{"user": user, "team": team, "global": "*"} for user, team in picks]


def run_ours(requests: list[dict]) -> float:
    config = {level: [{"type": "token_bucket", "capacity": c, "per_second": r}]
              for level, (c, r) in LIMITS.items()}
    acquire = HierarchicalLimiter.from_config(config, store=MemoryStore()).acquire
    start = time.perf_counter()
    for keys in requests:
        acquire(keys)
    return time.perf_counter() - start


def run_reference(requests: list[dict]) -> float:
    acquire, clock = ReferenceLimiter().acquire, time.monotonic
    start = time.perf_counter()
    for keys in requests:
        acquire(keys, clock())
    return time.perf_counter() - start


def run_limits(requests: list[dict], strategy) -> float:
    limiter = strategy(storage.MemoryStorage())
    items = {level: parse(f"{c}/second") for level, (c, _) in LIMITS.items()}
    user, team, glob = items["user"], items["team"], items["global"]
    hit = limiter.hit
    start = time.perf_counter()
    for keys in requests:
        hit(user, "user", keys["user"])
        hit(team, "team", keys["team"])
        hit(glob, "global", keys["global"])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decisions", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    requests = workload(args.decisions)
    contenders = {
        "ours: 3-level, thread-safe, bounded": run_ours,
        "reference: seed-003 loop, unlocked": run_reference,
        "limits: fixed window x3": lambda r: run_limits(r, strategies.FixedWindowRateLimiter),
        "limits: moving window x3": lambda r: run_limits(r, strategies.MovingWindowRateLimiter),
    }
    best = {name: float("inf") for name in contenders}
    for _ in range(args.rounds):
        for name, run in contenders.items():
            best[name] = min(best[name], run(requests))
    rate = {name: args.decisions / seconds for name, seconds in best.items()}
    ours = rate["ours: 3-level, thread-safe, bounded"]
    print(f"{args.decisions} decisions x {args.rounds} rounds, best round, Python {sys.version.split()[0]}")
    print(f"{'contender':40} {'decisions/s':>12} {'us/decision':>12} {'ours is':>9}")
    for name, value in rate.items():
        print(f"{name:40} {value:12,.0f} {1e6 / value:12.2f} {ours / value:8.2f}x")


if __name__ == "__main__":
    main()
