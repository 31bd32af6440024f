"""Deciding: one request, a batch, a reservation and its settlement.

    decided = ask({"keys": {"user": "u1", "team": "acme", "global": "*"}, "cost": 1})
    decided.decision.allowed, decided.ticket

Each function reads what it is asked (`inputs`), picks the limiter of the tenant that the
`team` key names (policies.compile), decides, and records the decision once (`recording`)
so that the statistics, the usage series and the what-if see it. What it answers is
transport-free: the REST views, forward-auth, Envoy's rate limit service and the console
shape it for their callers (`answers`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from core import Decision, HierarchicalLimiter, InvalidRequest, ReservationNotFound, ReservationSettled, Settlement
from core.limiter import acquire_batch

from ..compile import policy_cache
from ..policy import TENANT_LEVEL, Policy
from . import inputs
from .errors import conflict, invalid, not_found
from .leases import ticket
from .recording import record, record_many, record_reservation, reservation_opened, reservation_settled


class Decided(NamedTuple):
    """A decision with what its answer needs: the limiter that made it (its rules name the
    header fields), the keys it was made for, and the ticket of the slot it took, if any.
    `rows`: a dry run's per-rule findings (None when it was decided for real)."""

    limiter: HierarchicalLimiter
    keys: Mapping[str, str]
    decision: Decision
    ticket: str | None = None
    rows: list[dict] | None = None


class Reserved(NamedTuple):
    """A reservation asked for: the decision, and when it took, the reservation's id, its
    expiry (epoch seconds) and how long it holds. `cost` is the estimate asked for."""

    limiter: HierarchicalLimiter
    keys: Mapping[str, str]
    decision: Decision
    cost: float
    id: str | None = None
    expires_at: float | None = None
    hold: float | None = None


def current_policy() -> Policy:
    """The policy decisions use now: what every reading of a request checks names against."""
    return policy_cache().current()


def limiter_for(keys: Mapping[str, str]) -> HierarchicalLimiter:
    """The limiter of the tenant that the key set's `team` key names (its tier's, or its own)."""
    return policy_cache().limiter_for(keys.get(TENANT_LEVEL))


def decide(keys: Mapping[str, str], cost: float = 1, priority: str | None = None, slots: bool = True) -> Decided:
    """Decide one request whose keys, cost and priority are already read, and record it.
    `slots=False`: the concurrency rules are left out (HierarchicalLimiter.without_slots),
    for a caller that could not give a slot back."""
    limiter = limiter_for(keys) if slots else limiter_for(keys).without_slots()
    decision = limiter.acquire(keys, cost, priority)
    record(keys, decision, cost, priority)
    return Decided(limiter, keys, decision, ticket(keys, decision.lease))


def explain(keys: Mapping[str, str], cost: float = 1, priority: str | None = None, team: str | None = None) -> Decided:
    """A dry run: the decision `decide` would make now, and every rule's findings; nothing
    is taken and nothing recorded. `team` picks the tenant when `keys` name none (a user key
    alone, as the console asks)."""
    limiter = policy_cache().limiter_for(team) if team is not None else limiter_for(keys)
    decision, rows = limiter.explain(keys, cost, priority)
    return Decided(limiter, keys, decision, None, rows)


def ask(data: Any) -> Decided:
    """A decision request as JSON reads it (the body of /decisions): decided, or explained
    for a dry run. Invalid names the bad field."""
    asked = inputs.parse_decision(data, current_policy())
    if asked.dry_run:
        return explain(asked.keys, asked.cost, asked.priority)
    return decide(asked.keys, asked.cost, asked.priority)


def ask_batch(data: Any) -> list[Decided]:
    """A batch as JSON reads it (`{"requests": [...]}`): every item decided in order, as if
    made one after the other, in one round trip on Redis; recorded with one increment per
    metric. A bad item is refused before anything is taken."""
    cache = policy_cache()
    asked = inputs.parse_batch(data, cache.current())
    limiters = [cache.limiter_for(r.keys.get(TENANT_LEVEL)) for r in asked]
    try:
        decisions = acquire_batch([(lim, r.keys, r.cost, r.priority) for lim, r in zip(limiters, asked)])
    except InvalidRequest as error:  # an item's field, named by core as "<index>.<field>"
        if not error.field:
            raise
        raise invalid(f"requests.{error.field}", error.reason) from None
    record_many((r.keys, decision, r.cost, r.priority) for r, decision in zip(asked, decisions))
    return [
        Decided(lim, r.keys, decision, ticket(r.keys, decision.lease))
        for lim, r, decision in zip(limiters, asked, decisions)
    ]


def ask_reservation(data: Any) -> Reserved:
    """A reservation request as JSON reads it: the estimate taken at every level (and any
    concurrency slots), or nothing; recorded either way."""
    keys, cost, priority, hold = inputs.parse_reservation(data, current_policy())
    limiter = limiter_for(keys)
    decision, reservation = limiter.reserve(keys, cost, priority, hold)
    record_reservation(keys, decision, cost, priority, hold, reservation.id if reservation is not None else None)
    if reservation is None:
        return Reserved(limiter, keys, decision, cost)
    # The store's clock may not be the wall clock (in-process: monotonic), so the expiry is
    # reported as now plus what is left of the hold.
    left = reservation.expires_at - reservation.taken_at
    reservation_opened(reservation.id, left)
    return Reserved(limiter, keys, decision, cost, reservation.id, time.time() + left, left)


def settle(reservation_id: str, data: Any, commit: bool) -> Settlement:
    """Commit (with the body's `actual_cost`) or cancel a reservation. NotFound when it is
    unknown or expired, Conflict when it is settled already."""
    actual_cost = inputs.parse_settlement(data, required=commit)
    try:
        settlement = policy_cache().settle(reservation_id, actual_cost)
    except ReservationNotFound:
        raise not_found(f"no open reservation {reservation_id!r}: unknown, or expired", "id") from None
    except ReservationSettled:
        raise conflict(f"reservation {reservation_id!r} is already settled", "id") from None
    reservation_settled(reservation_id, settlement.status, actual_cost)
    return settlement
