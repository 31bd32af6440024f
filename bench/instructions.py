"""Bytecode instructions one in-process decision executes, counted exactly: the 3-level decision
of bench/engine.py (a token bucket per level, the plan cached), allowed and denied.

Run: .venv/bin/python bench/instructions.py [--against CHECKOUT]

Unlike a timing, the count does not move with the machine's load, so a change to the hot path
shows as what it adds, instruction by instruction, per function (`--by-function`). It says
nothing of what each instruction costs: C calls inside one instruction (a dict lookup, a lock)
are not counted apart.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from engine import LIMITS, engine_at  # noqa: E402

from core import HierarchicalLimiter, ManualClock, MemoryStore  # noqa: E402


def count(call) -> collections.Counter:
    """Instructions executed by `call()`, by function."""
    counted: collections.Counter = collections.Counter()

    def tracer(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode":
            counted[f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}"] += 1
        return tracer

    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
    return counted


def decisions(engine: tuple) -> dict[str, collections.Counter]:
    """The counts of an allowed decision and of a denial, both on a cached plan."""
    limiter_class, store_class = engine
    config = {level: [{"type": "token_bucket", "capacity": c, "per_second": r}] for level, (c, r) in LIMITS.items()}
    config["user"] = [{"type": "token_bucket", "capacity": 2, "per_second": 1}]  # denies the third
    limiter = limiter_class.from_config(config, store=store_class(), clock=ManualClock())
    keys = {"user": "u", "team": "t", "global": "*"}
    acquire = limiter.acquire
    acquire(keys)  # the plan is built and cached
    allowed = count(lambda: acquire(keys))
    denied = count(lambda: acquire(keys))
    return {"allowed": allowed, "denied": denied}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", metavar="CHECKOUT", help="also count the engine of another checkout")
    parser.add_argument("--by-function", action="store_true", help="the counts per function too")
    args = parser.parse_args()
    engines = {"this checkout": (HierarchicalLimiter, MemoryStore)}
    if args.against:
        engines[args.against] = engine_at(args.against)
    for name, engine in engines.items():
        counts = decisions(engine)
        print(f"{name}: allowed {counts['allowed'].total()} instructions, denied {counts['denied'].total()}")
        if args.by_function:
            for kind, counted in counts.items():
                print(f"  {kind}: " + ", ".join(f"{where} {n}" for where, n in sorted(counted.items())))


if __name__ == "__main__":
    main()
