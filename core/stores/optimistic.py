"""The Redis store's optimistic path, for plans with a plug-in rule that has no Lua twin.

WATCH the plan's keys, read every state, decide in Python (core/twophase.py, as the in-process
store does), then write what changed in MULTI/EXEC; if a key changed meanwhile, EXEC fails and
the whole decision is made again, with backoff, for up to OPTIMISTIC_DEADLINE. It costs 3 + n
round trips and retries under contention, where a Lua decision costs one: the price of a rule
that brings no Lua. The store (redis.py) calls it through its circuit breaker.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from redis.exceptions import WatchError

from .. import twophase
from ..decision import Finding
from ..errors import StoreUnavailable
from ..reservations import CANCELLED, COMMITTED, OPEN
from ..twophase import Slot
from .base import Check
from .keeping import decode_record, decode_state, read_state, write_state

# How long an optimistic decision keeps trying while other clients keep changing its keys.
OPTIMISTIC_DEADLINE = 1.0


class KeyedPlan(Protocol):
    """What this path needs of a Redis plan: its checks and the keys of their states."""

    @property
    def keys(self) -> tuple[str, ...]: ...

    @property
    def checks(self) -> list[Check]: ...


# What the path runs between the read and the write: (slots, time, the watched record's raw
# fields) -> (the answer, the record's fields to write or None).
Work = Callable[[list[Slot], float, Any], tuple[Any, "dict | None"]]


def read_slots(
    client: Any, plan: KeyedPlan, now: float | None, pipe: Any = None
) -> tuple[float, twophase.WrittenTable, list[Slot]]:
    """Every check's state, read in one round trip (or, on a pipeline that WATCHes, one by
    one, as WATCH works) and decoded into its rule's own shape, as slots: explain, inspect
    and the optimistic path run the rules' Python code on them. `now` None: Redis's TIME."""
    reader = pipe if pipe is not None else client.pipeline(transaction=True)
    results = [reader.time()]
    for key, check in zip(plan.keys, plan.checks):
        results.append(read_state(reader, key, check.rule))
    if pipe is None:
        results = reader.execute()
    (seconds, micros), *raw = results
    at = seconds + micros / 1_000_000 if now is None else now
    table = twophase.WrittenTable(
        {key: decode_state(check.rule, value) for key, check, value in zip(plan.keys, plan.checks, raw)}
    )
    slots = [
        Slot(c.rule, table, key, c.floor, c.rule.shadow, c.rule.counts_requests)
        for c, key in zip(plan.checks, plan.keys)
    ]
    return at, table, slots


class OptimisticPath:
    """Decide, release and settle on `client` by WATCH and MULTI/EXEC. Driver errors pass
    through (the store's breaker turns them into StoreUnavailable)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._turns = [threading.Lock() for _ in range(64)]

    def decide(
        self, plan: KeyedPlan, cost: float, now: float | None, lease: str | None, lease_until: float | None = None
    ) -> Finding:
        """The two phases on the plan's states. `lease_until`: when the lease, a
        reservation's, must run out (`twophase.reserve`)."""

        def decide(slots: list[Slot], at: float, _: Any) -> tuple[Finding, None]:
            if lease_until is None:
                return twophase.decide(slots, cost, at, lease), None
            return twophase.reserve(slots, cost, at, lease, lease_until), None

        return self._in_turn(plan, now, decide)

    def write_record(self, key: str, record: dict, ttl: int) -> None:
        """A reservation's record, once its take is done (no one knows its id before)."""
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=record)
            pipe.pexpire(key, ttl)
            pipe.execute()

    def adjust(self, plan: KeyedPlan, now: float | None, delta: float) -> list[float]:
        """Every rule adjusted by `delta` now (twophase.adjust: a top-up), with each balance."""

        def adjust(slots: list[Slot], at: float, _: Any) -> tuple[list[float], None]:
            return twophase.adjust(slots, at, delta), None

        return self._in_turn(plan, now, adjust)

    def release(self, plan: KeyedPlan, now: float | None, lease: str) -> int:
        def release(slots: list[Slot], at: float, _: Any) -> tuple[int, None]:
            return twophase.release(slots, at, lease), None

        return self._in_turn(plan, now, release)

    def settle(self, plan: KeyedPlan, record_key: str, actual_cost: float | None, now: float | None) -> list:
        """The Lua's settle in Python: the record is watched with the rules' keys, and marked
        settled in the same MULTI/EXEC. Answers as the Lua does: [b"missing"], [b"settled",
        status] or [b"ok", released, delta]."""

        def settle(slots: list[Slot], at: float, raw: dict) -> tuple[list, dict | None]:
            record = decode_record(raw) if raw else None
            if record is None or at >= record["expires_at"]:
                return [b"missing"], None
            if record["status"] != OPEN:
                return [b"settled", record["status"].encode()], None
            delta = (actual_cost or 0) - record["cost"]
            untaken = {name.decode().removeprefix("untaken:") for name in raw if name.startswith(b"untaken:")}
            released = twophase.settle(slots, at, delta, record["taken_at"], untaken, record["lease"])
            status = CANCELLED if actual_cost is None else COMMITTED
            fields = {"status": status, "actual_cost": json.dumps(actual_cost)}
            return [b"ok", released, repr(float(delta))], fields

        return self._in_turn(plan, now, settle, record_key)

    def _in_turn(self, plan: KeyedPlan, now: float | None, work: Work, record_key: str | None = None) -> Any:
        # Threads of this process take turns per key set, so that WATCH only ever races
        # other processes: 200 threads all watching one key would mostly fail each other.
        with self._turns[hash(plan.keys) % len(self._turns)]:
            return self._watch_and_write(plan, now, work, record_key)

    def _watch_and_write(self, plan: KeyedPlan, now: float | None, work: Work, record_key: str | None) -> Any:
        """WATCH the plan's keys (and a reservation's record, read first and handed to
        `work`), read every state, let `work` change them, and write back in MULTI/EXEC
        the states it changed (and the record's fields it returns)."""
        deadline = time.monotonic() + OPTIMISTIC_DEADLINE
        with self.client.pipeline(transaction=True) as pipe:
            for attempt in itertools.count():
                if attempt and time.monotonic() > deadline:
                    break
                if attempt:  # back off, with jitter, so that contenders stop colliding
                    time.sleep(random.uniform(0, min(0.01, 0.0002 * 2**attempt)))
                try:
                    pipe.watch(*plan.keys, *([record_key] if record_key else []))
                    record = pipe.hgetall(record_key) if record_key else None
                    at, table, slots = read_slots(self.client, plan, now, pipe)
                    result, fields = work(slots, at, record)
                    pipe.multi()
                    _write_back(pipe, plan, table, at)
                    if fields and record_key:
                        pipe.hset(record_key, mapping=fields)
                    pipe.execute()
                    return result
                except WatchError:
                    continue
        raise StoreUnavailable(f"Redis keys kept changing for {OPTIMISTIC_DEADLINE} s")


def _write_back(pipe: Any, plan: KeyedPlan, table: twophase.WrittenTable, at: float) -> None:
    # What the two phases wrote, and only that, goes back: a denial writes nothing, so no
    # state comes out of it expiring sooner than it went in.
    for check, key in zip(plan.checks, plan.keys):
        if key not in table.written:
            continue
        if table.get(key) is not None:
            write_state(pipe, key, check.rule, table[key], at)
        else:
            pipe.delete(key)  # as good as no state: a bucket refunded to full


def record_ttl(hold: float) -> int:
    """Milliseconds a reservation's record is kept: its hold and a second of slack, as for state."""
    return math.ceil(hold * 1000) + 1000


__all__ = ["OPTIMISTIC_DEADLINE", "KeyedPlan", "OptimisticPath", "read_slots", "record_ttl"]
