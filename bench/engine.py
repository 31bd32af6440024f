"""Decisions per second of a 3-level decision (user, team, global; one token bucket each),
side by side in one process with:

- the `limits` library's MemoryStorage doing the same three levels as three `hit` calls,
  with its fixed window and its moving window;
- a plain, unlocked reference loop (a dict of tuples per rule: check every rule, then take
  from every rule), the shortest correct two-phase limiter, neither thread-safe nor bounded.

Run: .venv/bin/python bench/engine.py [--decisions N] [--rounds R] [--tight] [--against CHECKOUT] [--quota]
Each contender runs R rounds interleaved with the others, each in turn going first; the best
round counts. A round is timed in CPU seconds of this process (time.process_time), so that
other processes on a busy machine count for little, and starts after a garbage collection,
so that no contender pays for the garbage of the round before. `--against CHECKOUT` adds the
engine of another checkout (`git worktree add /tmp/before <commit>`) as one more contender, so
that a change is measured against the code it changed, round by round in the same process.
`--quota` adds our decision with a quota at the team level (a month's, in Europe/Berlin) in
place of the team's token bucket, and with a soft quota beside it (which takes the decision off
the compiled path: its decisions may name it), so that a quota's cost shows against a bucket's.

Time is simulated, one decision every 10 microseconds (100,000 a second), and ours and
the reference read the same timestamps, so both make exactly the same allow/deny
decisions whatever their speed. (`limits` reads the wall clock; it cannot be given one.)
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from limits import parse, storage, strategies  # noqa: E402

from core import HierarchicalLimiter, MemoryStore  # noqa: E402

# CPU time of this process: one thread, so what the loop costs, whoever else shares the CPUs.
cpu_seconds = time.process_time

USERS, TEAMS = 1000, 50
TICK = 1e-5  # simulated seconds between two decisions
LIMITS = {"user": (100, 50), "team": (2000, 1000), "global": (1_000_000, 100_000)}


class ReferenceBucket:
    """The plainest token bucket: state in a dict, refill computed in both phases."""

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
        checks = [(level, rule, keys[level]) for level, rules in self.levels.items() if level in keys for rule in rules]
        worst, blocker = 0.0, None
        for level, rule, key in checks:
            wait = rule.wait_time(key, now, cost)
            if wait > worst:
                worst, blocker = wait, f"{level}: {rule.name}"
        if worst > 0:
            return (False, worst, blocker)
        for _level, rule, key in checks:
            rule.take(key, now, cost)
        return (True, 0.0, None)


def workload(n: int) -> list[dict]:
    rng = random.Random(7)
    users = [(f"user-{i}", f"team-{i % TEAMS}") for i in range(USERS)]
    picks = [users[rng.randrange(USERS)] for _ in range(n)]
    return [{"user": user, "team": team, "global": "*"} for user, team in picks]


# The team level's rules in the --quota variants: a hard month's quota where the bucket was,
# and the bucket with a soft quota beside it. The limits are far above the run's traffic.
QUOTA = {"type": "quota", "limit": 10**12, "period": "month", "timezone": "Europe/Berlin"}
QUOTA_VARIANTS = {
    "ours: team quota for the team bucket": [QUOTA],
    "ours: team bucket + soft quota": ["bucket", {**QUOTA, "mode": "soft"}],
}


def run_ours(
    requests: list[dict],
    allowed: list | None = None,
    engine: tuple = (HierarchicalLimiter, MemoryStore),
    team: list | None = None,
) -> float:
    limiter_class, store_class = engine
    config = {level: [{"type": "token_bucket", "capacity": c, "per_second": r}] for level, (c, r) in LIMITS.items()}
    if team is not None:  # the --quota variants: "bucket" stands for the team's token bucket
        config["team"] = [config["team"][0] if rule == "bucket" else rule for rule in team]
    clock = iter(simulated_times(len(requests))).__next__
    acquire = limiter_class.from_config(config, store=store_class(), clock=clock).acquire
    start = cpu_seconds()
    for keys in requests:
        acquire(keys)
    elapsed = cpu_seconds() - start
    if allowed is not None:  # a second, untimed pass to count what was admitted
        clock = iter(simulated_times(len(requests))).__next__
        acquire = limiter_class.from_config(config, store=store_class(), clock=clock).acquire
        allowed.append(sum(acquire(keys).allowed for keys in requests))
    return elapsed


def engine_at(checkout: str) -> tuple:
    """HierarchicalLimiter and MemoryStore from the core/ of another checkout, imported beside
    this one's (its modules are put back under their names once it is loaded)."""
    ours = {name: module for name, module in sys.modules.items() if name == "core" or name.startswith("core.")}
    for name in ours:
        del sys.modules[name]
    sys.path.insert(0, os.path.abspath(checkout))
    try:
        other = importlib.import_module("core")
        return other.HierarchicalLimiter, other.MemoryStore
    finally:
        sys.path.pop(0)
        for name in [name for name in sys.modules if name == "core" or name.startswith("core.")]:
            del sys.modules[name]
        sys.modules.update(ours)


def run_reference(requests: list[dict], allowed: list | None = None) -> float:
    limiter, times = ReferenceLimiter(), simulated_times(len(requests))
    acquire = limiter.acquire
    start = cpu_seconds()
    for keys, now in zip(requests, times):
        acquire(keys, now)
    elapsed = cpu_seconds() - start
    if allowed is not None:
        limiter = ReferenceLimiter()
        allowed.append(sum(limiter.acquire(keys, now)[0] for keys, now in zip(requests, times)))
    return elapsed


def simulated_times(n: int) -> list[float]:
    return [i * TICK for i in range(n)]


def run_limits(requests: list[dict], strategy) -> float:
    limiter = strategy(storage.MemoryStorage())
    items = {level: parse(f"{c}/second") for level, (c, _) in LIMITS.items()}
    user, team, glob = items["user"], items["team"], items["global"]
    hit = limiter.hit
    start = cpu_seconds()
    for keys in requests:
        hit(user, "user", keys["user"])
        hit(team, "team", keys["team"])
        hit(glob, "global", keys["global"])
    return cpu_seconds() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decisions", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--tight", action="store_true", help="a user bucket of 20 at 10/s, so that about half are denied"
    )
    parser.add_argument(
        "--quota", action="store_true", help="also time our decision with a quota at the team level (see above)"
    )
    parser.add_argument(
        "--against",
        metavar="CHECKOUT",
        help="also time the engine of another checkout (a worktree of an earlier commit), in this process",
    )
    args = parser.parse_args()
    if args.tight:
        LIMITS["user"] = (20, 10)
    requests = workload(args.decisions)
    contenders = {
        "ours: 3-level, thread-safe, bounded": run_ours,
        "reference: plain loop, unlocked": run_reference,
        "limits: fixed window x3": lambda r: run_limits(r, strategies.FixedWindowRateLimiter),
        "limits: moving window x3": lambda r: run_limits(r, strategies.MovingWindowRateLimiter),
    }
    if args.against:
        other = engine_at(args.against)
        contenders["ours at --against"] = lambda r: run_ours(r, engine=other)
    if args.quota:
        for name, team in QUOTA_VARIANTS.items():
            contenders[name] = lambda r, team=team: run_ours(r, team=team)
    best = {name: float("inf") for name in contenders}
    order = list(contenders.items())
    for i in range(args.rounds):
        for name, run in order[i % len(order) :] + order[: i % len(order)]:
            gc.collect()
            best[name] = min(best[name], run(requests))
    admitted: list[int] = []
    run_ours(requests, admitted)
    run_reference(requests, admitted)
    if args.against:
        run_ours(requests, admitted, other)
    if len(set(admitted)) != 1:
        raise SystemExit(f"ours, the reference (and --against) admitted {admitted}: not the same work")
    rate = {name: args.decisions / seconds for name, seconds in best.items()}
    ours = rate["ours: 3-level, thread-safe, bounded"]
    print(
        f"{args.decisions} decisions x {args.rounds} rounds, best round, Python {sys.version.split()[0]};"
        f" ours and the reference both admitted {admitted[0]}"
    )
    print(f"{'contender':40} {'decisions/s':>12} {'us/decision':>12} {'ours is':>9}")
    for name, value in rate.items():
        print(f"{name:40} {value:12,.0f} {1e6 / value:12.2f} {ours / value:8.2f}x")


if __name__ == "__main__":
    main()
