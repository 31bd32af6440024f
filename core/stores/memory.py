"""The in-process store: rule state in sharded dicts, each shard behind its own lock.

A decision locks the shards of the keys it touches, in shard order (so two decisions can
never wait on each other in a cycle), checks every rule, then takes from all or none.
Decisions on keys in other shards go on in parallel.

Memory stays bounded: every entry carries the time it goes idle (its bucket is full
again, its window has passed), and a sweep drops idle entries. Sweeps are paid for by
writes, one shard at a time in turn, so that the whole store is swept once for about every
`len(store) / 2` writes: on average a few entries looked at per write, and no long pause.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Sequence

from .base import Check, Outcome, Store

INFINITY = float("inf")
NO_SHADOWS: tuple[int, ...] = ()
SWEEP_MIN_WRITES = 256


class MemoryPlan:
    """One key set, resolved: per check its rule, table and key, plus the locks to take."""

    __slots__ = ("slots", "locks", "leased")

    def __init__(self, slots: list, locks: list) -> None:
        self.slots = slots
        self.locks = locks
        self.leased = [s for s in slots if s[0].leased]


class MemoryStore(Store):
    """Rule state in this process: exact under threads, bounded in memory."""

    clock = staticmethod(time.monotonic)

    def __init__(self, shards: int = 64) -> None:
        self._locks = [threading.Lock() for _ in range(shards)]
        self._tables: list[dict[str, tuple[Any, float]]] = [{} for _ in range(shards)]
        self._writes = 0
        self._sweep_at = SWEEP_MIN_WRITES
        self._next_shard = 0

    def __len__(self) -> int:
        return sum(len(table) for table in self._tables)

    def prepare(self, checks: Sequence[Check]) -> MemoryPlan:
        slots, shards = [], set()
        for level, key, rule, floor in checks:
            name = f"{level}\x1f{key}\x1f{rule.rule_id}"
            shard = hash(name) % len(self._tables)
            shards.add(shard)
            slots.append((rule, self._tables[shard], name, floor, rule.shadow, rule.counts_requests))
        return MemoryPlan(slots, [self._locks[i] for i in sorted(shards)])

    def decide(self, plan: MemoryPlan, cost: float, now: float, lease: str | None) -> Outcome:
        for lock in plan.locks:
            lock.acquire()
        try:
            outcome = self._decide(plan.slots, cost, now, lease)
        finally:
            for lock in plan.locks:
                lock.release()
        if outcome[0] < 0:
            self._writes += 1
            if self._writes >= self._sweep_at:
                self._sweep_next(now)
        return outcome

    @staticmethod
    def _decide(slots: list, cost: float, now: float, lease: str | None) -> Outcome:
        worst, blocker, shadows, states = 0.0, -1, NO_SHADOWS, []
        for i, (rule, table, name, floor, shadow, per_request) in enumerate(slots):
            entry = table.get(name)
            state = None if entry is None else entry[0]
            states.append(state)
            wait = rule.wait(state, now, 1.0 if per_request else cost, floor)
            if wait > 0.0:
                if shadow:
                    shadows += (i,)
                elif wait > worst:
                    worst, blocker = wait, i
        if blocker >= 0:
            return blocker, worst, slots[blocker][0].remaining(states[blocker], now), shadows
        remaining = INFINITY
        for i, (rule, table, name, floor, shadow, per_request) in enumerate(slots):
            if shadow and i in shadows:
                continue  # a shadow rule that would deny takes nothing, as if it were enforced
            entry = table[name] = rule.take(states[i], now, 1.0 if per_request else cost, lease)
            if not shadow:
                left = rule.remaining(entry[0], now)
                if left < remaining:
                    remaining = left
        return -1, 0.0, remaining, shadows

    def explain(self, plan: MemoryPlan, cost: float, now: float) -> list[tuple[float, float]]:
        with _Locked(plan.locks):
            out = []
            for rule, table, name, floor, _, per_request in plan.slots:
                state = self._state(table, name)
                wait = rule.wait(state, now, 1.0 if per_request else cost, floor)
                out.append((wait, rule.remaining(state, now)))
            return out

    def inspect(self, plan: MemoryPlan, now: float) -> list[dict]:
        with _Locked(plan.locks):
            return [rule.inspect(self._state(table, name), now)
                    for rule, table, name, *_ in plan.slots]

    def release(self, plan: MemoryPlan, now: float, lease: str) -> int:
        released = 0
        with _Locked(plan.locks):
            for rule, table, name, *_ in plan.leased:
                entry = rule.release(self._state(table, name), now, lease)
                if entry is not None:
                    table[name] = entry
                    released += 1
        return released

    def reset(self, plan: MemoryPlan) -> None:
        with _Locked(plan.locks):
            for _, table, name, *_ in plan.slots:
                table.pop(name, None)

    @staticmethod
    def _state(table: dict, name: str) -> Any:
        entry = table.get(name)
        return None if entry is None else entry[0]

    def sweep(self, now: float) -> int:
        """Drop every idle entry now; returns how many were dropped."""
        return sum(self._sweep_shard(i, now) for i in range(len(self._tables)))

    def _sweep_next(self, now: float) -> None:
        # Racing threads may sweep the same shard twice or skip one; both are harmless.
        shard = self._next_shard
        self._next_shard = (shard + 1) % len(self._tables)
        self._sweep_shard(shard, now)
        self._sweep_at = self._writes + max(SWEEP_MIN_WRITES, len(self._tables[shard]) // 2)

    def _sweep_shard(self, shard: int, now: float) -> int:
        table = self._tables[shard]
        with self._locks[shard]:
            idle = [name for name, (_, idle_at) in table.items() if idle_at <= now]
            for name in idle:
                del table[name]
        return len(idle)


class _Locked:
    """Hold a plan's locks, in order, for a `with` block."""

    __slots__ = ("locks",)

    def __init__(self, locks: list) -> None:
        self.locks = locks

    def __enter__(self) -> None:
        for lock in self.locks:
            lock.acquire()

    def __exit__(self, *exc: object) -> None:
        for lock in self.locks:
            lock.release()
