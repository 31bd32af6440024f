"""The in-process store: rule state in sharded dicts, each shard behind its own lock.

A decision locks the shards of the keys it touches, in shard order (so two decisions can
never wait on each other in a cycle), checks every rule, then takes from all or none.
Decisions on keys in other shards go on in parallel.

Memory stays bounded: every entry carries the time it goes idle (its bucket is full
again, its window has passed), and a sweep drops idle entries. Sweeps are paid for by
decisions, allowed or denied, one shard at a time in turn, so that the whole store is swept
once for about every `len(store) / 2` decisions: on average a few entries looked at per
decision, and no long pause, even when every request is denied.
Reservation records live in a dict beside the shards; each new reservation drops the records
(open or settled) whose hold has run out.
"""

from __future__ import annotations

import heapq
import itertools
import linecache
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from .. import twophase
from ..decision import Decision, Finding, allowed, found, inline_allowed
from ..errors import ReservationNotFound, ReservationSettled
from ..reservations import CANCELLED, COMMITTED, OPEN
from ..rules import EPSILON, Rule
from ..twophase import Slot
from .base import AsyncDecider, Check, Store

T = TypeVar("T")

INFINITY = float("inf")
SWEEP_MIN_DECISIONS = 256


class MemoryPlan:
    """One key set, resolved: a slot per check (its rule, shard table and state name), plus the
    locks of the shards it touches.

    `lean` is the decision compiled for this plan (see `compile_lean`), when it has no
    shadow rule and no rule that changes its state in place; `slots` serves every path.
    """

    __slots__ = ("slots", "lean", "locks", "leased")

    def __init__(self, slots: list[Slot], locks: list[threading.Lock], store: MemoryStore) -> None:
        self.slots = slots
        self.locks = locks
        self.leased = [s for s in slots if s.rule.leased]
        simple = all(type(s.rule).attempt is not Rule.attempt and not s.shadow for s in slots)
        self.lean = compile_lean(slots, locks, store) if simple else None


def compile_lean(slots: list[Slot], locks: list[threading.Lock], store: MemoryStore) -> Callable[..., Any]:
    """The decision for these slots as straight-line code: take the locks, ask each rule in
    turn, stop at the first that does not fit, write the new states only once all fit.

    This is the hot path of every in-process decision. Written out, it costs about a
    third less than loops over the locks and slots: no loop, no list of results, every
    name a closure variable. The code is generated once per shape of plan (how many locks
    and slots, which slots count requests, which are soft); its source holds only numbers
    and the allowed decision's expression from `decision.inline_allowed` (derived from
    Decision's fields), never a rule's value. A denial reads the waits of the rules after the
    one that denied, in the same straight line, and `twophase.denial` makes its Finding. A
    soft rule (a soft quota) counts in no `remaining`; a decision that takes one below zero
    answers with the Finding that names it (`over`), as twophase.decide would.
    """
    if not slots:
        return lambda cost, now, lease=None: allowed(INFINITY)
    shape = (len(locks), tuple(slot.per_request for slot in slots), tuple(slot.rule.soft for slot in slots))
    make = _LEAN_MAKERS.get(shape) or _LEAN_MAKERS.setdefault(shape, _lean_maker(*shape))
    values: list[Any] = [partial(twophase.denial, slots), store._counted, store._sweep_due, store._sweep_next]
    values += [lock.acquire for lock in locks] + [lock.release for lock in locks]
    for rule, table, name, floor, _, _ in slots:
        values += [rule.attempt, rule.wait, table.get, table, name, floor]
    return make(*values)


_LEAN_MAKERS: dict[tuple, Callable] = {}


def _lean_maker(locks: int, counts_requests: tuple, soft: tuple) -> Callable:
    # Every decision, allowed or denied, is counted once the locks are let go (in `finally`,
    # which a denial's return goes through too), so that a sweep, which takes a shard's
    # lock, never runs under them.
    params = ["deny", "counted", "due", "sweep"] + [f"lock{j}" for j in range(locks)]
    params += [f"unlock{j}" for j in range(locks)]
    lines = [f"        lock{j}()" for j in range(locks)] + ["        try:"]
    costs = ["1.0" if per_request else "cost" for per_request in counts_requests]
    for i, cost in enumerate(costs):
        params += [f"a{i}", f"w{i}", f"g{i}", f"t{i}", f"n{i}", f"f{i}"]
        lines += [f"            s{i} = a{i}(g{i}(n{i}), now, {cost}, f{i})", f"            if s{i}.__class__ is float:"]
        if i == len(costs) - 1:
            lines += [f"                return deny({i}, s{i}, now)"]
            continue
        # Denied at i: only the rules after it can wait longer; the longest wait blocks.
        # (One name a statement: `b, w = i, s` costs a SWAP more.)
        lines += [f"                b = {i}", f"                w = s{i}"]
        for j in range(i + 1, len(costs)):
            lines += [
                f"                s = w{j}(g{j}(n{j}), now, {costs[j]}, f{j})",
                f"                if s > w: b = {j}; w = s",
            ]
        lines += ["                return deny(b, w, now)"]
    lines += [f"            t{i}[n{i}] = s{i}" for i in range(len(counts_requests))]
    lines += ["            pass", "        finally:"] + [f"            unlock{j}()" for j in reversed(range(locks))]
    lines += ["            if next(counted) >= due[0]: sweep(now)"]
    enforced = [i for i, is_soft in enumerate(soft) if not is_soft]
    lines += [f"        left = s{enforced[0]}[1]" if enforced else "        left = INFINITY"]
    lines += [f"        if s{i}[1] < left: left = s{i}[1]" for i in enforced[1:]]
    if len(enforced) < len(soft):
        lines += ["        over = ()"]
        lines += [f"        if s{i}[1] < -EPSILON: over += ({i},)" for i, is_soft in enumerate(soft) if is_soft]
        lines += ["        if over: return found(-1, 0.0, left, (), over)"]
    decision, names = inline_allowed("left")
    lines += [f"        return {decision}"]
    source = (
        f"def make({', '.join(params)}):\n    def decide(cost, now, lease=None):\n"
        + "\n".join(lines)
        + "\n    return decide\n"
    )
    # A file name of its own, its source in linecache: a traceback shows the generated line.
    slots = ",".join(
        ("request" if per_request else "cost") + (" soft" if is_soft else "")
        for per_request, is_soft in zip(counts_requests, soft)
    )
    filename = f"<core/stores/memory.py lean decide: {locks} locks, slots {slots}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace: dict[str, Any] = {"INFINITY": INFINITY, "EPSILON": EPSILON, "found": found, **names}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["make"]


class MemoryStore(Store[MemoryPlan]):
    """Rule state in this process: exact under threads, bounded in memory."""

    clock = staticmethod(time.monotonic)
    name = "in-process memory, this process only"

    def __init__(self, shards: int = 64) -> None:
        self._locks = [threading.Lock() for _ in range(shards)]
        self._tables: list[dict[str, Any]] = [{} for _ in range(shards)]
        # Decisions so far (counted by next(): one C call, atomic), and in a list, so that
        # the compiled decisions read it too, the count at which the next shard is swept.
        self._counted = itertools.count(1)
        self._sweep_due = [SWEEP_MIN_DECISIONS]
        self._next_shard = 0
        # Reservation records by id, and (expires_at, id) to drop them once they expire.
        self._records: dict[str, dict] = {}
        self._expiries: list[tuple[float, str]] = []
        self._records_lock = threading.Lock()

    def __len__(self) -> int:
        return sum(len(table) for table in self._tables)

    def prepare(self, checks: Sequence[Check]) -> MemoryPlan:
        slots, shards = [], set()
        for level, key, rule, floor in checks:
            name = f"{level}\x1f{key}\x1f{rule.rule_id}"
            shard = hash(name) % len(self._tables)
            shards.add(shard)
            slots.append(Slot(rule, self._tables[shard], name, floor, rule.shadow, rule.counts_requests))
        return MemoryPlan(slots, [self._locks[i] for i in sorted(shards)], self)

    def decide(self, plan: MemoryPlan, cost: float, now: float, lease: str | None) -> Decision | Finding:
        if plan.lean is not None:
            return plan.lean(cost, now)  # takes the locks and counts the decision itself
        with _Locked(plan.locks):
            outcome = twophase.decide(plan.slots, cost, now, lease)
        self._count_decision(now)
        return outcome

    def decider(self, plan: MemoryPlan) -> Callable[[float, float, str | None], Decision | Finding]:
        return plan.lean or partial(self.decide, plan)

    def adecider(self, plan: MemoryPlan) -> AsyncDecider:
        """The plan's decider, called in the coroutine itself: an in-process decision never
        waits on I/O (its locks are held for a few microseconds), so a thread would only add
        the hop."""
        decide = self.decider(plan)

        async def adecide(cost: float, now: float, lease: str | None = None) -> Decision | Finding:
            return decide(cost, now, lease)

        return adecide

    async def call_async(self, function: Callable[..., T], *args: Any) -> T:
        return function(*args)  # in process: nothing to wait on

    def _count_decision(self, now: float) -> None:
        """Count a decision towards the next sweep, and sweep when it is due."""
        if next(self._counted) >= self._sweep_due[0]:
            self._sweep_next(now)

    def explain(self, plan: MemoryPlan, cost: float, now: float) -> list[tuple[float, float]]:
        with _Locked(plan.locks):
            return twophase.explain(plan.slots, cost, now)

    def inspect(self, plan: MemoryPlan, now: float) -> list[dict]:
        with _Locked(plan.locks):
            return twophase.inspect(plan.slots, now)

    def release(self, plan: MemoryPlan, now: float, lease: str) -> int:
        with _Locked(plan.locks):
            return twophase.release(plan.leased, now, lease)

    def reset(self, plan: MemoryPlan) -> None:
        with _Locked(plan.locks):
            for slot in plan.slots:
                slot.table.pop(slot.name, None)

    def adjust(self, plan: MemoryPlan, now: float, delta: float) -> list[float]:
        with _Locked(plan.locks):
            return twophase.adjust(plan.slots, now, delta)

    # --- reservations: records in a dict, dropped once they expire ----------------------

    def reserve(self, plan: MemoryPlan, cost: float, now: float, lease: str | None, record: dict) -> Decision | Finding:
        with _Locked(plan.locks):
            outcome = twophase.reserve(plan.slots, cost, now, lease, record["expires_at"])
        self._count_decision(now)
        if outcome[0] >= 0:
            return outcome
        # No one knows the id before this returns: the record need not be written under the
        # same locks as the take.
        untaken = frozenset(plan.slots[i].name for i in outcome[3])  # shadow rules took nothing
        with self._records_lock:
            self._forget_records(now)
            self._records[record["id"]] = {**record, "status": OPEN, "untaken": untaken}
            heapq.heappush(self._expiries, (record["expires_at"], record["id"]))
        return outcome

    def reservation(self, reservation_id: str, now: float | None = None) -> dict | None:
        with self._records_lock:
            record = self._records.get(reservation_id)
            if record is None or (now is not None and now >= record["expires_at"]):
                return None
            return _public(record)

    def settle(self, plan: MemoryPlan, reservation_id: str, actual_cost: float | None, now: float) -> tuple[float, int]:
        with _Locked(plan.locks), self._records_lock:
            record = self._records.get(reservation_id)
            if record is None or now >= record["expires_at"]:
                raise ReservationNotFound(f"no reservation {reservation_id!r} (unknown or expired)")
            if record["status"] != OPEN:
                raise ReservationSettled(f"reservation {reservation_id!r} is already {record['status']}")
            record["status"] = CANCELLED if actual_cost is None else COMMITTED
            record["actual_cost"] = actual_cost
            delta = (actual_cost or 0) - record["cost"]
            released = twophase.settle(plan.slots, now, delta, record["taken_at"], record["untaken"], record["lease"])
            return delta, released

    def _forget_records(self, now: float) -> None:
        """Drop the records (open or tombstones) whose hold has run out; under the lock."""
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            _, reservation_id = heapq.heappop(expiries)
            self._records.pop(reservation_id, None)

    def sweep(self, now: float) -> int:
        """Drop every idle entry now; returns how many were dropped."""
        return sum(self._sweep_shard(i, now) for i in range(len(self._tables)))

    def _sweep_next(self, now: float) -> None:
        # Racing threads may sweep the same shard twice or skip one; both are harmless.
        shard = self._next_shard
        self._next_shard = (shard + 1) % len(self._tables)
        self._sweep_shard(shard, now)
        # From the count that made it due: threads that found it due at once each sweep a
        # shard and move it on, which only sweeps a little sooner.
        self._sweep_due[0] += max(SWEEP_MIN_DECISIONS, len(self._tables[shard]) // 2)

    def _sweep_shard(self, shard: int, now: float) -> int:
        table = self._tables[shard]
        with self._locks[shard]:
            idle = [name for name, state in table.items() if state[0] <= now]
            for name in idle:
                del table[name]
        return len(idle)


def _public(record: dict) -> dict:
    """A record as `reservation()` shows it: the store's own bookkeeping left out."""
    return {**{k: v for k, v in record.items() if k != "untaken"}, "keys": dict(record["keys"])}


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
