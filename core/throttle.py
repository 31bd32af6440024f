"""A client-side throttle that blocks until a request may go, on the same rules as the limiter.

throttle = Throttle.from_rules([
    {"type": "token_bucket", "capacity": 50, "per_second": 50 / 60, "counts": "requests"},
    {"type": "token_bucket", "capacity": 40_000, "per_second": 40_000 / 60},
])
throttle.acquire(cost=estimated_tokens)   # sleeps until both buckets have room
with throttle.hold() as got:              # a concurrency slot, handed back when the block ends
    ...
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from .decision import Decision
from .errors import InvalidRequest
from .limiter import COST_EXCEEDS_LIMIT, HierarchicalLimiter
from .stores import MemoryStore, Store

LEVEL, KEY = "client", "self"


class Throttle:
    """Waits on a limiter's `retry_after` instead of failing. The wait happens outside any
    lock, so other threads keep using the room that is there.

    A wait for a concurrency slot ends as soon as `hold()` hands one back in this process,
    as a semaphore's would; the slot's lease running out, which brings back a slot that a
    holder elsewhere never released, is only the fallback. That needs real time: with a
    `sleep` of its own (a test's, a simulation's), every wait is that sleep, to its end.
    """

    def __init__(
        self,
        limiter: HierarchicalLimiter,
        keys: Mapping[str, str],
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.limiter = limiter
        self.keys = dict(keys)
        self.sleep = sleep if sleep is not None else time.sleep
        self._wakes = sleep is None  # whether a release may cut a wait for a slot short
        self._released = threading.Condition()
        self._releases = 0  # how many slots `hold()` handed back so far

    @classmethod
    def from_rules(
        cls,
        rules: list[dict],
        store: Store | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> Throttle:
        """One level of rules that this process alone spends from."""
        limiter = HierarchicalLimiter.from_config({LEVEL: rules}, store if store is not None else MemoryStore(1), clock)
        return cls(limiter, {LEVEL: KEY}, sleep)

    def acquire(self, cost: float = 1, timeout: float | None = None) -> bool:
        """Block until `cost` is taken; False if that would take longer than `timeout`."""
        return self._wait_for(cost, timeout) is not None

    @contextmanager
    def hold(self, cost: float = 1, timeout: float | None = None) -> Iterator[bool]:
        """Like `acquire`, and hands back any concurrency slot when the block ends."""
        decision = self._wait_for(cost, timeout)
        try:
            yield decision is not None
        finally:
            if decision is not None and decision.lease:
                self.limiter.release(self.keys, decision.lease)
                with self._released:
                    self._releases += 1
                    self._released.notify_all()

    def _wait_for(self, cost: float, timeout: float | None) -> Decision | None:
        clock = self.limiter.clock
        deadline = None if timeout is None else clock() + timeout
        while True:
            releases = self._releases  # read first: a release from now on is not missed
            decision = self.limiter.acquire(self.keys, cost)
            if decision.allowed:
                return decision
            if decision.reason == COST_EXCEEDS_LIMIT:
                raise InvalidRequest(f"can never fit: {decision.blocked_by}", "cost")
            wait = decision.retry_after
            if math.isinf(wait) and deadline is None:
                raise InvalidRequest(f"would wait forever: {decision.blocked_by} never refills", "cost")
            if self._wakes and self._waits_for_a_slot(decision):
                left = math.inf if deadline is None else deadline - clock()
                if left <= 0:
                    return None
                self._wait_for_release(releases, min(wait, left))
                continue
            if deadline is not None and clock() + wait > deadline:
                return None
            self.sleep(wait)

    def _waits_for_a_slot(self, decision: Decision) -> bool:
        rule = self.limiter.rule_named(decision.blocked_by)
        return rule is not None and rule.leased

    def _wait_for_release(self, releases: int, seconds: float) -> None:
        """Wait until `hold()` hands a slot back (at once if one came back since `releases`
        was read), or for `seconds`."""
        with self._released:
            if self._releases == releases:
                self._released.wait(seconds)
