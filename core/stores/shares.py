"""A shared global budget: the alternative to splitting a global key into sub-buckets.

The global token bucket lives in one Redis key, the pool. Each process takes a share of it
(`fraction` of the capacity, or the cost if more) and decides the global level locally
against its share, with no round trip, until the share runs out or `interval` passes; then
it gives back what it did not use and takes a new share, in one call (lua/share.lua).

The global limit is never exceeded: a token is spent locally only after the pool handed it
out. The price: tokens sitting in other processes' shares are not available to this one
until they come back (at most `interval` later), so under contention a process may deny
while the sum over processes still has room, and a process that dies holding a share loses
it (never more than one share). A decision's other levels still go to Redis in one script
call; a denial there gives the tokens back to the local share, so a denial takes nothing.

Only rules whose twin says they are shareable (token buckets, GCRA) at the shared levels,
with no priority reserve and no shadow flag, are shared; any other rule there goes to the
store behind, where a cluster keeps it as sub-buckets (see cluster.py).

`SharedBudgets` is that: a store in front of another (a cluster's router), which decides the
shared checks on this process's BudgetShares and hands the rest to the store behind; each
pool is called through the node store that holds its key, and so through that node's breaker.

The cluster's `global_mode="lease"` (and its `lease_fraction`, `lease_interval`, the settings
LIMITER_CLUSTER_GLOBAL_MODE and LIMITER_CLUSTER_LEASE_FRACTION) is this: the mode is called
`lease` for its operators, and hands out shares. ("Lease" in the engine is a concurrency slot's.)
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from ..buckets import bucket_state
from ..decision import Decision, Finding, found
from ..errors import StoreUnavailable
from .base import AsyncDecider, Check, Wrapper
from .keeping import rule_tag

SHARE_SCRIPT = (Path(__file__).parent / "lua" / "share.lua").read_text()
DEFAULT_FRACTION = 0.02  # of the capacity per share: 50 shares make the whole budget
DEFAULT_INTERVAL = 1.0  # seconds a share may be used before what is left goes back
EPSILON = 1e-9


def shareable(check: Any) -> bool:
    """Whether a check's rule can be decided against a share of its pool: its twin says it
    can (a token bucket's), and it keeps no reserve and is not a shadow."""
    twin = check.rule.redis_twin
    return twin is not None and twin.shareable and not check.rule.shadow and not check.floor


class BudgetShare:
    """This process's share of one pool. `call(key, now, capacity, rate, want, need,
    give_back)` runs lua/share.lua and returns (granted, pool left, wait)."""

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
        self.size = self.capacity * fraction
        self.counts_requests = rule.counts_requests
        self.allowance = 0.0  # what is left of the share; below zero: a debt (a settled charge)
        self.expires = 0.0
        self.pool = self.capacity  # the pool as last seen
        self._lock = threading.Lock()

    def take(self, amount: float, now: float | None) -> tuple[bool, float, float]:
        """(taken, wait, room): from the share if it covers `amount`, else from a new share."""
        with self._lock:
            if self.allowance >= amount - EPSILON and self.clock() < self.expires:
                self.allowance -= amount
                return True, 0.0, self.allowance
            give_back = self.allowance
            granted, self.pool, wait = self.call(
                self.key, now, self.capacity, self.rate, max(amount, self.size), amount, give_back
            )
            self.allowance = 0.0  # given back (only once the pool has it: a failed call keeps it)
            if granted >= amount - EPSILON:
                self.allowance, self.expires = granted - amount, self.clock() + self.interval
                return True, 0.0, self.allowance
            if wait < 0:  # the pool never refills enough; others' shares come back, though
                wait = math.inf if amount > self.capacity else self.interval
            return False, wait, self.pool

    def give(self, amount: float) -> None:
        """Back into the share: a decision that another level denied, or a refund."""
        with self._lock:
            self.allowance += amount


class SharedPlan:
    """A plan whose shared checks are decided on BudgetShares and the rest (`inner`) by the
    store behind. `shares`: (index among the checks, BudgetShare); `inner_index`: each inner
    check's index among the checks."""

    __slots__ = ("checks", "shares", "inner", "inner_index", "keys", "leased")

    def __init__(
        self, checks: Sequence[Check], shares: list[tuple[int, BudgetShare]], inner: Any, inner_index: list[int]
    ) -> None:
        self.checks, self.shares, self.inner, self.inner_index = list(checks), shares, inner, inner_index
        self.keys: tuple[str, ...] = inner.keys  # the inner plan's, on its shard
        self.leased: bool = inner.leased  # holds a concurrency slot

    def outcome(self, inner: Decision | Finding) -> Decision | Finding:
        """The inner plan's outcome with its indices turned into this plan's."""
        if type(inner) is Decision:
            return inner
        blocker, wait, remaining, shadows, over = inner
        index = self.inner_index
        return found(
            index[blocker] if blocker >= 0 else -1,
            wait,
            remaining,
            tuple(index[i] for i in shadows),
            tuple(index[i] for i in over),
        )

    def rows(self, inner_rows: list, row: Callable[[BudgetShare], Any]) -> list:
        """One row per check, in order: the inner plan's rows, and `row(share)` for each
        shared check."""
        rows: list = [None] * len(self.checks)
        for i, reading in zip(self.inner_index, inner_rows):
            rows[i] = reading
        for i, share in self.shares:
            rows[i] = row(share)
        return rows


# Runs lua/share.lua on the node that holds the pool: (pool key, arguments) -> reply.
PoolCall = Callable[[str, Sequence[Any]], Any]


class SharedBudgets(Wrapper[SharedPlan]):
    """The shared checks of `levels` on this process's shares of pools in the store behind;
    everything else handed to that store. `pools(key, args)` runs lua/share.lua on a pool."""

    def __init__(
        self,
        inner: Any,
        pools: PoolCall,
        levels: frozenset[str],
        prefix: str,
        fraction: float = DEFAULT_FRACTION,
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(inner)
        self.pools, self.levels, self.prefix = pools, levels, prefix
        self.fraction, self.interval, self.share_clock = fraction, interval, clock
        self.shares: dict[str, BudgetShare] = {}  # by pool key: one per pool in this process

    def prepare(self, checks: Sequence[Check]) -> SharedPlan:
        shared = [i for i, check in enumerate(checks) if check.level in self.levels and shareable(check)]
        rest = [i for i in range(len(checks)) if i not in shared]
        inner = self.inner.prepare([checks[i] for i in rest])
        return SharedPlan(checks, [(i, self._share(checks[i])) for i in shared], inner, rest)

    def _share(self, check: Check) -> BudgetShare:
        key = f"{self.prefix}:{{{check.level}:{check.key}}}:{rule_tag(check.rule)}:pool"
        share = self.shares.get(key)
        if share is None:
            made = BudgetShare(key, check.rule, self._call_pool, self.fraction, self.interval, self.share_clock)
            share = self.shares.setdefault(key, made)
        return share

    def _call_pool(
        self, key: str, now: float | None, capacity: float, rate: float, want: float, need: float, give_back: float
    ) -> tuple[float, float, float]:
        at = "-" if now is None else repr(now)
        granted, pool, wait = self.pools(key, [at, repr(capacity), repr(rate), repr(want), repr(need), repr(give_back)])
        return float(granted), float(pool), float(wait)

    # --- decisions --------------------------------------------------------------------------

    def decide(self, plan: SharedPlan, cost: float, now: float, lease: str | None) -> Decision | Finding:
        return self._take(plan, cost, now, lambda inner: self.inner.decide(inner, cost, now, lease))

    def decider(self, plan: SharedPlan) -> Callable[[float, float, str | None], Decision | Finding]:
        if not plan.shares:  # nothing shared: the store behind decides it, indices and all
            return self.inner.decider(plan.inner)
        return partial(self.decide, plan)

    def adecider(self, plan: SharedPlan) -> AsyncDecider:
        """Nothing shared: the store behind's own; else the shares' decision, in a thread (a
        share that runs out asks its pool)."""
        if not plan.shares:
            return self.inner.adecider(plan.inner)
        return super().adecider(plan)

    def reserve(self, plan: SharedPlan, cost: float, now: float, lease: str | None, record: dict) -> Decision | Finding:
        return self._take(plan, cost, now, lambda inner: self.inner.reserve(inner, cost, now, lease, record), True)

    def decide_many(
        self, items: Sequence[tuple[SharedPlan, float, float, str | None]]
    ) -> list[Decision | Finding | StoreUnavailable]:
        """The plans with nothing shared in one batch of the store behind, between those with
        shared checks, each decided alone in its turn (their shares are in this process)."""
        results: list = [None] * len(items)
        batch: list[int] = []
        for i, (plan, cost, now, lease) in enumerate(items):
            if not plan.shares:
                batch.append(i)
                continue
            self._decide_batch(items, batch, results)
            batch = []
            try:
                results[i] = self.decide(plan, cost, now, lease)
            except StoreUnavailable as error:
                results[i] = error
        self._decide_batch(items, batch, results)
        return results

    def _decide_batch(
        self, items: Sequence[tuple[SharedPlan, float, float, str | None]], batch: list[int], results: list
    ) -> None:
        if batch:
            inner = self.inner.decide_many([(items[i][0].inner, *items[i][1:]) for i in batch])
            for i, outcome in zip(batch, inner):
                results[i] = outcome

    def _take(
        self, plan: SharedPlan, cost: float, now: float | None, inner_call: Callable, always: bool = False
    ) -> Any:
        """Take from every share (denying at the first that cannot give), then let the
        store behind decide the other levels; a denial there, or an error, gives the shares
        back. `always`: ask the store behind even with no check of its own (a reservation's
        record goes there)."""
        taken: list[tuple[BudgetShare, float]] = []
        room = math.inf
        try:
            for index, share in plan.shares:
                amount = 1.0 if share.counts_requests else cost
                ok, wait, left = share.take(amount, now)
                if not ok:
                    _give_back(taken)
                    return found(index, wait, left)
                taken.append((share, amount))
                room = min(room, left)
            if not plan.inner.keys and not always:
                return found(-1, 0.0, room)
            outcome = inner_call(plan.inner)
        except BaseException:
            _give_back(taken)
            raise
        if type(outcome) is not Decision and outcome[0] >= 0:
            _give_back(taken)
        return plan.outcome(outcome)

    # --- the rest ---------------------------------------------------------------------------

    def release(self, plan: SharedPlan, now: float, lease: str) -> int:
        return self.inner.release(plan.inner, now, lease) if plan.leased else 0

    def settle(self, plan: SharedPlan, reservation_id: str, actual_cost: float | None, now: float) -> tuple[float, int]:
        delta, released = self.inner.settle(plan.inner, reservation_id, actual_cost, now)
        for _, share in plan.shares:  # as the Lua's settle: rules that count cost, by the difference
            if not share.counts_requests:
                share.give(-delta)
        return delta, released

    def adjust(self, plan: SharedPlan, now: float, delta: float) -> list[float]:
        """The checks of the store behind; a shared check (a token bucket's share, never a
        quota's: a quota is not shareable) is not adjusted, and shows its pool's tokens."""
        rows = self.inner.adjust(plan.inner, now, delta) if plan.inner.keys else []
        return plan.rows(rows, lambda share: self._pool_state(share, now)["tokens"])

    def new_reservation_id(self, plan: SharedPlan) -> str:
        return self.inner.new_reservation_id(plan.inner)

    def explain(self, plan: SharedPlan, cost: float, now: float) -> list[tuple[float, float]]:
        def row(share: BudgetShare) -> tuple[float, float]:
            room = self._pool_state(share, now)["remaining"]
            amount = 1.0 if share.counts_requests else cost
            return (0.0 if room >= amount else math.inf if amount > share.capacity else share.interval), room

        return plan.rows(self.inner.explain(plan.inner, cost, now) if plan.inner.keys else [], row)

    def inspect(self, plan: SharedPlan, now: float) -> list[dict]:
        """A shared check: its pool and this process's share."""
        rows = self.inner.inspect(plan.inner, now) if plan.inner.keys else []
        return plan.rows(rows, lambda share: self._pool_state(share, now))

    def reset(self, plan: SharedPlan) -> None:
        for _, share in plan.shares:
            share.allowance = 0.0
            # A pool reset is a pool given back everything: it is full again.
            self._call_pool(share.key, None, share.capacity, share.rate, 0.0, 0.0, share.capacity)
        if plan.inner.keys:
            self.inner.reset(plan.inner)

    def _pool_state(self, share: BudgetShare, now: float | None) -> dict:
        """The pool as it is now (taking nothing), plus what is left of this process's share."""
        _, pool, _ = self._call_pool(share.key, now, share.capacity, share.rate, 0.0, 0.0, 0.0)
        # The share's allowance is below zero while a settled charge is in debt.
        tokens = min(share.capacity, pool + share.allowance)
        # "leased": the inspection's key as the API has always shown it, kept for its readers.
        return {**bucket_state(tokens, share.capacity, share.rate), "leased": True}


def _give_back(taken: list[tuple[BudgetShare, float]]) -> None:
    for share, amount in taken:
        share.give(amount)
