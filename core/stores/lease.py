"""A leased global budget: the alternative to splitting a global key into sub-buckets.

The global token bucket lives in one Redis key, the pool. Each process takes a slice of it
(`fraction` of the capacity, or the cost if more) and decides the global level locally
against its slice, with no round trip, until the slice runs out or `interval` passes; then it
gives back what it did not use and takes a new slice, in one call (lua/lease.lua).

The global limit is never exceeded: a token is spent locally only after the pool handed it
out. The price: tokens sitting in other processes' slices are not available to this one
until they come back (at most `interval` later), so under contention a process may deny
while the sum over processes still has room, and a process that dies holding a slice loses
it (never more than one slice). A decision's other levels still go to Redis in one script
call; a denial there gives the tokens back to the local slice, so a denial takes nothing.

Only plain token buckets (and GCRA) at the leased levels, with no priority reserve and no
shadow flag, are leased; any other rule there stays a sub-bucket (see cluster.py).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, final

from ..buckets import GCRA, TokenBucket

LEASE_SCRIPT = (Path(__file__).parent / "lua" / "lease.lua").read_text()
DEFAULT_FRACTION = 0.02  # of the capacity per slice: 50 slices make the whole budget
DEFAULT_INTERVAL = 1.0  # seconds a slice may be used before what is left goes back
EPSILON = 1e-9


def leasable(check: Any) -> bool:
    """Whether a check's rule can be decided against a leased slice."""
    return type(check.rule) in (TokenBucket, GCRA) and not check.rule.shadow and not check.floor


class Budget:
    """This process's slice of one pool. `call(key, now, capacity, rate, want, need,
    give_back)` runs lua/lease.lua and returns (granted, pool left, wait)."""

    def __init__(
        self,
        key: str,
        rule: Any,
        call: Callable,
        fraction: float = DEFAULT_FRACTION,
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.key, self.call, self.interval, self.clock = key, call, interval, clock
        self.capacity, self.rate = float(rule.capacity), float(rule.rate)
        self.slice = self.capacity * fraction
        self.counts_requests = rule.counts_requests
        self.allowance = 0.0  # what is left of the slice; below zero: a debt (a settled charge)
        self.expires = 0.0
        self.pool = self.capacity  # the pool as last seen
        self._lock = threading.Lock()

    def take(self, amount: float, now: float | None) -> tuple[bool, float, float]:
        """(taken, wait, room): from the slice if it covers `amount`, else from a new slice."""
        with self._lock:
            if self.allowance >= amount - EPSILON and self.clock() < self.expires:
                self.allowance -= amount
                return True, 0.0, self.allowance
            give_back = self.allowance
            granted, self.pool, wait = self.call(
                self.key, now, self.capacity, self.rate, max(amount, self.slice), amount, give_back
            )
            self.allowance = 0.0  # given back (only once the pool has it: a failed call keeps it)
            if granted >= amount - EPSILON:
                self.allowance, self.expires = granted - amount, self.clock() + self.interval
                return True, 0.0, self.allowance
            if wait < 0:  # the pool never refills enough; others' slices come back, though
                wait = math.inf if amount > self.capacity else self.interval
            return False, wait, self.pool

    def give(self, amount: float) -> None:
        """Back into the slice: a decision that another level denied, or a refund."""
        with self._lock:
            self.allowance += amount


@final  # see ClusterPlan
class LeasedPlan:
    """A plan whose leasable checks are decided on Budgets and the rest (`inner`, maybe None)
    on Redis. `budgets`: (index among the checks, Budget); `inner_index`: each inner check's
    index among the checks. Batches decide it alone, in its turn (`optimistic`)."""

    optimistic = True

    def __init__(self, checks: list, budgets: list, inner: Any, inner_index: list[int]) -> None:
        self.checks, self.budgets, self.inner, self.inner_index = checks, budgets, inner, inner_index
        self.leased = bool(inner is not None and inner.leased)
        self.keys = inner.keys if inner is not None else ()
        self.key_count = len(self.keys)

    def outcome(self, inner: Any) -> Any:
        """The inner plan's outcome with its indices turned into this plan's."""
        blocker, wait, remaining, shadows = inner
        index = self.inner_index
        return (index[blocker] if blocker >= 0 else -1, wait, remaining, tuple(index[i] for i in shadows))
