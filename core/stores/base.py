"""The store protocol: where rule state lives, and the one atomic step per decision.

A decision is one call, `decide`: check every rule of every level, then take from all or
from none, atomically (core/twophase.py, or its Lua twin). Everything the limiter does per key
set is prepared once (`prepare`), into the store's own plan, so the per-decision call
carries no work that could have been done earlier. A plan is opaque to the limiter, which
hands each store only the plans it prepared.

A store implements the required methods; each of the others has a default built from them
(as Django's BaseCache does), which a store may replace with something faster:

    required  prepare, decide, explain, inspect, release, reset, adjust,
              reserve, reservation, settle
    derived   decider (decide, bound to a plan), decide_many (a loop of decide), time (the
              clock), new_reservation_id, ping (nothing to ask), close (nothing to let go),
              health (up); for asyncio: adecider (the decider, in a thread) and call_async
              (any call, in a thread)

Reservations (`reserve`, `reservation`, `settle`) keep a record per reservation in the
store itself, so that any process sharing the store can settle it; `decide_many` decides a
batch in order, in one round trip where the store is remote.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Generic, NamedTuple, TypedDict, TypeVar

from ..decision import Decision, Finding
from ..errors import StoreUnavailable
from ..reservations import new_reservation_id
from ..rules import Rule

PlanT = TypeVar("PlanT")
T = TypeVar("T")

# A plan's decision for asyncio: (cost, now, lease) -> what `decide` returns, awaited.
AsyncDecider = Callable[[float, float, "str | None"], Awaitable["Decision | Finding"]]


class Check(NamedTuple):
    """One rule to evaluate for one key: the unit a plan is made of."""

    level: str
    key: str
    rule: Rule
    floor: float  # what a priority watermark keeps in reserve, in the rule's units


class Health(TypedDict):
    """How one part of a store is doing, for operators: `state` "up" or "down"; `down_since`
    the wall-clock time (epoch seconds) of the first failure of the current outage, or None;
    `failures` the failed calls in a row."""

    name: str
    state: str
    down_since: float | None
    failures: int


class Store(Generic[PlanT]):
    """Base class of the stores, generic over the plan a store prepares."""

    # The clock used when the limiter is not given one. A store whose clock is elsewhere
    # (Redis TIME) returns None: the store reads it itself.
    clock: Any = None
    # What operators call it (health()).
    name: str = "store"

    # --- required ---------------------------------------------------------------------------

    def prepare(self, checks: Sequence[Check]) -> PlanT:
        """Resolve `checks` into whatever makes `decide` cheap (keys, locks, script args)."""
        raise NotImplementedError(f"{type(self).__name__} must implement prepare()")

    def decide(self, plan: PlanT, cost: float, now: float, lease: str | None) -> Decision | Finding:
        """Check every rule, then take `cost` from all of them or from none. Returns what it
        found, or, for a plain allowed decision, the finished Decision (`decision.allowed`),
        which saves the limiter a step."""
        raise NotImplementedError(f"{type(self).__name__} must implement decide()")

    def explain(self, plan: PlanT, cost: float, now: float) -> list[tuple[float, float]]:
        """(wait, remaining) of every check, consuming nothing."""
        raise NotImplementedError(f"{type(self).__name__} must implement explain()")

    def inspect(self, plan: PlanT, now: float) -> list[dict]:
        """The live state of every check, as each rule describes it."""
        raise NotImplementedError(f"{type(self).__name__} must implement inspect()")

    def release(self, plan: PlanT, now: float, lease: str) -> int:
        """Give back what `lease` holds in the plan's leased rules; returns how many gave."""
        raise NotImplementedError(f"{type(self).__name__} must implement release()")

    def reset(self, plan: PlanT) -> None:
        """Forget the state of every check: the keys start full again."""
        raise NotImplementedError(f"{type(self).__name__} must implement reset()")

    def adjust(self, plan: PlanT, now: float, delta: float) -> list[float]:
        """In one atomic step, charge (delta > 0) or give back (delta < 0) `delta` at every
        check, now, outside any reservation (each rule's `adjust`: a top-up of credits is a
        refund); returns each check's balance after (`Rule.balance`)."""
        raise NotImplementedError(f"{type(self).__name__} must implement adjust()")

    def reserve(self, plan: PlanT, cost: float, now: float, lease: str | None, record: dict) -> Decision | Finding:
        """`decide`, and when it takes, keep `record` (a Reservation's to_dict()) open until
        its `expires_at`, so that `settle` can find it from any process using this store."""
        raise NotImplementedError(f"{type(self).__name__} must implement reserve()")

    def reservation(self, reservation_id: str, now: float | None = None) -> dict | None:
        """The record of a reservation, with its `status` ("open", "committed" or
        "cancelled"); None when unknown or expired at `now` (None: the store's own time)."""
        raise NotImplementedError(f"{type(self).__name__} must implement reservation()")

    def settle(self, plan: PlanT, reservation_id: str, actual_cost: float | None, now: float) -> tuple[float, int]:
        """In one atomic step: check the record is open, mark it settled (it stays until it
        expires, as a tombstone), give back or charge `actual_cost - cost` at every rule
        that counts cost (all of it when `actual_cost` is None: a cancel), and release the
        lease. Returns (that difference, slots released). Raises ReservationNotFound or
        ReservationSettled."""
        raise NotImplementedError(f"{type(self).__name__} must implement settle()")

    # --- derived, with defaults ---------------------------------------------------------------

    def decider(self, plan: PlanT) -> Callable[[float, float, str | None], Decision | Finding]:
        """`decide` bound to one plan: what the limiter calls per decision. A store may
        return something faster than the default for plans it knows to be simple."""
        return partial(self.decide, plan)

    def adecider(self, plan: PlanT) -> AsyncDecider:
        """`decider` for a coroutine: the same decision, awaited without blocking the event
        loop. The default runs the plan's decider in a thread; a store that can wait on
        its network without one (Redis, on redis-py's asyncio client) or that never waits
        (in process) replaces it."""
        decide = self.decider(plan)

        async def adecide(cost: float, now: float, lease: str | None = None) -> Decision | Finding:
            return await asyncio.to_thread(decide, cost, now, lease)

        return adecide

    async def call_async(self, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)`, one of this store's calls (an explain, a release), from a
        coroutine without blocking the event loop: in a thread by default; a store in this
        process, which never waits on I/O, calls it at once."""
        return await asyncio.to_thread(function, *args)

    def decide_many(
        self, items: Sequence[tuple[PlanT, float, float, str | None]]
    ) -> list[Decision | Finding | StoreUnavailable]:
        """`decide` for each (plan, cost, now, lease), in order, as if one after the other.
        An item the store could not decide comes back as its StoreUnavailable (the others
        still count). The default is a loop; a remote store sends them in one round trip."""
        results: list[Decision | Finding | StoreUnavailable] = []
        for plan, cost, now, lease in items:
            try:
                results.append(self.decide(plan, cost, now, lease))
            except StoreUnavailable as error:
                results.append(error)
        return results

    def time(self) -> float:
        """Now on the store's clock, for records that must carry a time. The default reads
        `clock`; a store whose clock is elsewhere (Redis `TIME`) asks for it."""
        return self.clock()

    def new_reservation_id(self, plan: PlanT) -> str:
        """A fresh reservation id for a reservation on `plan`. A store whose records must
        live beside the plan's keys (a cluster's shard) may name that place in the id."""
        return new_reservation_id()

    def ping(self) -> None:
        """Raise StoreUnavailable unless the store answers (readiness probes). The default,
        for a store in this process, has nothing to ask."""

    def close(self) -> None:
        """Release connections; the default has nothing to release."""

    def health(self) -> list[Health]:
        """How each part of the store is doing (a cluster has one part per node), from what
        its calls met so far: nothing is asked here. The default, for a store in this
        process: one part, up."""
        return [Health(name=self.name, state="up", down_since=None, failures=0)]


class Wrapper(Store[PlanT]):
    """A store in front of another, `inner`: every call goes to it, but those the wrapper
    answers in its own way (a subclass overrides them)."""

    def __init__(self, inner: Store[Any]) -> None:
        self.inner = inner
        self.clock = inner.clock
        self.name = inner.name

    def prepare(self, checks: Sequence[Check]) -> PlanT:
        return self.inner.prepare(checks)

    def decide(self, plan: PlanT, cost: float, now: float, lease: str | None) -> Decision | Finding:
        return self.inner.decide(plan, cost, now, lease)

    def decider(self, plan: PlanT) -> Callable[[float, float, str | None], Decision | Finding]:
        return self.inner.decider(plan)

    # No adecider here: a wrapper that decides in its own way (its decider) is awaited in
    # a thread, by the default, unless it says otherwise.

    async def call_async(self, function: Callable[..., T], *args: Any) -> T:
        return await self.inner.call_async(function, *args)

    def decide_many(
        self, items: Sequence[tuple[PlanT, float, float, str | None]]
    ) -> list[Decision | Finding | StoreUnavailable]:
        return self.inner.decide_many(items)

    def explain(self, plan: PlanT, cost: float, now: float) -> list[tuple[float, float]]:
        return self.inner.explain(plan, cost, now)

    def inspect(self, plan: PlanT, now: float) -> list[dict]:
        return self.inner.inspect(plan, now)

    def release(self, plan: PlanT, now: float, lease: str) -> int:
        return self.inner.release(plan, now, lease)

    def reset(self, plan: PlanT) -> None:
        self.inner.reset(plan)

    def adjust(self, plan: PlanT, now: float, delta: float) -> list[float]:
        return self.inner.adjust(plan, now, delta)

    def reserve(self, plan: PlanT, cost: float, now: float, lease: str | None, record: dict) -> Decision | Finding:
        return self.inner.reserve(plan, cost, now, lease, record)

    def reservation(self, reservation_id: str, now: float | None = None) -> dict | None:
        return self.inner.reservation(reservation_id, now)

    def settle(self, plan: PlanT, reservation_id: str, actual_cost: float | None, now: float) -> tuple[float, int]:
        return self.inner.settle(plan, reservation_id, actual_cost, now)

    def time(self) -> float:
        return self.inner.time()

    def new_reservation_id(self, plan: PlanT) -> str:
        return self.inner.new_reservation_id(plan)

    def ping(self) -> None:
        self.inner.ping()

    def close(self) -> None:
        self.inner.close()

    def health(self) -> list[Health]:
        return self.inner.health()
