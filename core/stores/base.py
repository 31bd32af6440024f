"""The store interface: where rule state lives, and the one atomic step per decision.

A decision is one call, `decide`: check every rule of every level, then take from all or
from none, atomically. On Redis that call is one Lua script; in memory it runs under the
locks of the keys involved. Everything the limiter does per key set is prepared once
(`prepare`), so the per-decision call carries no work that could have been done earlier.

Reservations (`reserve`, `reservation`, `settle`) keep a record per reservation in the
store itself, so that any process sharing the store can settle it; `decide_many` decides a
batch in order, in one round trip where the store is remote.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple, TypeAlias

from ..decision import Decision
from ..errors import StoreUnavailable
from ..reservations import new_reservation_id
from ..rules import Rule


class Check(NamedTuple):
    """One rule to evaluate for one key: the unit a plan is made of."""

    level: str
    key: str
    rule: Rule
    floor: float  # what a priority watermark keeps in reserve, in the rule's units


# What `decide` found, as a plain tuple (the hot path builds no object for it):
# (blocker, wait, remaining, shadow_blocked). `blocker` is the index of the check that denied,
# or -1; `wait` its wait; `remaining` the room of the tightest rule (of the blocker, on a
# denial); `shadow_blocked` the indices of the shadow checks that would have denied.
Finding: TypeAlias = tuple[int, float, float, tuple[int, ...]]
# What `decide` returns: a Finding, or, for a plain allowed decision, the finished Decision
# (`core.decision.allowed(remaining)`), which saves the limiter a step.
Outcome: TypeAlias = Finding | Decision


class Store:
    """Base class of the stores. Subclasses implement the required methods below."""

    # The clock used when the limiter is not given one.
    clock: Any = None

    def prepare(self, checks: Sequence[Check]) -> Any:
        """Resolve `checks` into whatever makes `decide` cheap (keys, locks, script args)."""
        raise NotImplementedError(f"{type(self).__name__} must implement prepare()")

    def decide(self, plan: Any, cost: float, now: float, lease: str | None) -> Outcome:
        """Check every rule, then take `cost` from all of them or from none."""
        raise NotImplementedError(f"{type(self).__name__} must implement decide()")

    def decider(self, plan: Any) -> Callable[[float, float, str | None], Outcome]:
        """`decide` bound to one plan: what the limiter calls per decision. A store may
        return something faster than the default for plans it knows to be simple."""
        return partial(self.decide, plan)

    def explain(self, plan: Any, cost: float, now: float) -> list[tuple[float, float]]:
        """(wait, remaining) of every check, consuming nothing."""
        raise NotImplementedError(f"{type(self).__name__} must implement explain()")

    def inspect(self, plan: Any, now: float) -> list[dict]:
        """The live state of every check, as each rule describes it."""
        raise NotImplementedError(f"{type(self).__name__} must implement inspect()")

    def release(self, plan: Any, now: float, lease: str) -> int:
        """Give back what `lease` holds in the plan's leased rules; returns how many gave."""
        raise NotImplementedError(f"{type(self).__name__} must implement release()")

    def reset(self, plan: Any) -> None:
        """Forget the state of every check: the keys start full again."""
        raise NotImplementedError(f"{type(self).__name__} must implement reset()")

    def close(self) -> None:
        """Release connections; the default has nothing to release."""

    def ping(self) -> None:
        """Raise StoreUnavailable unless the store answers (readiness probes). The default,
        for a store in this process, has nothing to ask."""

    # --- batches ------------------------------------------------------------------------

    def decide_many(self, items: Sequence[tuple[Any, float, float, str | None]]) -> list[Outcome | StoreUnavailable]:
        """`decide` for each (plan, cost, now, lease), in order, as if one after the other.
        An item the store could not decide comes back as its StoreUnavailable (the others
        still count). The default is a loop; a remote store sends them in one round trip."""
        results: list = []
        for plan, cost, now, lease in items:
            try:
                results.append(self.decide(plan, cost, now, lease))
            except StoreUnavailable as error:
                results.append(error)
        return results

    # --- reservations -------------------------------------------------------------------

    def time(self) -> float:
        """Now on the store's clock, for records that must carry a time. The default reads
        `clock`; a store whose clock is elsewhere (Redis `TIME`) asks for it."""
        return self.clock()

    def new_reservation_id(self, plan: Any) -> str:
        """A fresh reservation id for a reservation on `plan`. A store whose records must
        live beside the plan's keys (a cluster's shard) may name that place in the id."""
        return new_reservation_id()

    def reserve(self, plan: Any, cost: float, now: float, lease: str | None, record: dict) -> Outcome:
        """`decide`, and when it takes, keep `record` (a Reservation's to_dict()) open until
        its `expires_at`, so that `settle` can find it from any process using this store."""
        raise NotImplementedError(f"{type(self).__name__} must implement reserve()")

    def reservation(self, reservation_id: str, now: float | None = None) -> dict | None:
        """The record of a reservation, with its `status` ("open", "committed" or
        "cancelled"); None when unknown or expired at `now` (None: the store's own time)."""
        raise NotImplementedError(f"{type(self).__name__} must implement reservation()")

    def settle(self, plan: Any, reservation_id: str, actual_cost: float | None, now: float) -> tuple[float, int]:
        """In one atomic step: check the record is open, mark it settled (it stays until it
        expires, as a tombstone), give back or charge `actual_cost - cost` at every rule
        that counts cost (all of it when `actual_cost` is None: a cancel), and release the
        lease. Returns (that difference, slots released). Raises ReservationNotFound or
        ReservationSettled."""
        raise NotImplementedError(f"{type(self).__name__} must implement settle()")
