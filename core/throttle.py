"""A client-side throttle that blocks until a request may go (seed 002), on the same rules.

throttle = Throttle.from_rules([
    {"type": "token_bucket", "capacity": 50, "per_second": 50 / 60, "counts": "requests"},
    {"type": "token_bucket", "capacity": 40_000, "per_second": 40_000 / 60},
])
throttle.acquire(cost=estimated_tokens)   # sleeps until both buckets have room
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from .errors import InvalidRequest
from .limiter import COST_EXCEEDS_LIMIT, HierarchicalLimiter
from .stores import MemoryStore, Store

LEVEL, KEY = "client", "self"


class Throttle:
    """Waits on a limiter's `retry_after` instead of failing. The sleep happens outside any
    lock, so other threads keep using the room that is there."""

    def __init__(
        self, limiter: HierarchicalLimiter, keys: Mapping[str, str], sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self.limiter = limiter
        self.keys = dict(keys)
        self.sleep = sleep

    @classmethod
    def from_rules(
        cls,
        rules: list[dict],
        store: Store | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Throttle:
        """One level of rules that this process alone spends from."""
        limiter = HierarchicalLimiter.from_config({LEVEL: rules}, store or MemoryStore(1), clock)
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

    def _wait_for(self, cost: float, timeout: float | None):
        clock = self.limiter.clock
        deadline = None if timeout is None else clock() + timeout
        while True:
            decision = self.limiter.acquire(self.keys, cost)
            if decision.allowed:
                return decision
            if decision.reason == COST_EXCEEDS_LIMIT:
                raise InvalidRequest(f"can never fit: {decision.blocked_by}", "cost")
            wait = decision.retry_after
            if math.isinf(wait) and deadline is None:
                raise InvalidRequest(f"would wait forever: {decision.blocked_by} never refills", "cost")
            if deadline is not None and clock() + wait > deadline:
                return None
            self.sleep(wait)
