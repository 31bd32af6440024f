"""Reservations: take an estimated cost now, settle it later with the real one.

    decision, reservation = limiter.reserve(keys, cost=4000)      # the estimate
    ...                                                           # the work
    limiter.settle(reservation.id, actual_cost=1312)              # 2688 come back

The store keeps a record of every open reservation, so any worker that shares the store
can settle it. The record lives for `hold` seconds; once settled it stays, as a tombstone,
until then, so that a second settle is recognised rather than refunded twice.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .errors import InvalidRequest
from .params import LARGEST_NUMBER

DEFAULT_HOLD = 60.0
LONGEST_HOLD = 86400.0
# What a record's status is: open until settled, then how it was settled.
OPEN, COMMITTED, CANCELLED = "open", "committed", "cancelled"
_FIELDS = ("id", "keys", "cost", "priority", "taken_at", "expires_at", "lease", "hold")


def new_reservation_id() -> str:
    """22 random URL-safe characters: unguessable, so an id is its own permission to settle."""
    return secrets.token_urlsafe(16)


@dataclass(frozen=True)
class Reservation:
    """An estimated cost taken at every level, open until settled or until `expires_at`.

    `taken_at` and `expires_at` are seconds on the store's clock (Redis `TIME` on Redis,
    unless a clock was injected). `lease` holds the concurrency slots, if any.
    """

    id: str
    keys: dict
    cost: float
    priority: str | None
    taken_at: float
    expires_at: float
    lease: str | None
    hold: float

    def to_dict(self) -> dict:
        """JSON-safe: every value a str, number, None or a dict of str."""
        return {**asdict(self), "keys": dict(self.keys)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Reservation:
        """The reverse of `to_dict`; fields it does not know (a store's `status`) are ignored."""
        missing = [name for name in _FIELDS if name not in data]
        if missing:
            raise ValueError(f"a reservation needs {', '.join(missing)}")
        return cls(**{name: data[name] for name in _FIELDS} | {"keys": dict(data["keys"])})


@dataclass(frozen=True)
class Settlement:
    """What settling a reservation did. `refunded` and `charged` are the difference between
    the reserved and the actual cost (one of them is 0); a rule gives back less when a refund
    would raise it above its capacity or its window has moved on. `released` counts the
    concurrency slots handed back."""

    id: str
    status: str  # "committed" or "cancelled"
    refunded: float
    charged: float
    released: int

    def to_dict(self) -> dict:
        return asdict(self)


def clean_hold(hold: Any, longest: float) -> float:
    """The hold in seconds: DEFAULT_HOLD when None, at most `longest` (the shortest
    concurrency lease of the plan, so that a reservation never outlives its slot)."""
    if hold is None:
        return min(DEFAULT_HOLD, longest)
    if isinstance(hold, bool) or not isinstance(hold, (int, float)) or not 0 < hold <= LONGEST_HOLD:
        raise InvalidRequest(
            f"must be a number of seconds above 0 and at most {LONGEST_HOLD:.0f}, got {hold!r}", "hold"
        )
    return min(float(hold), longest)


def clean_actual_cost(actual_cost: Any) -> float | None:
    """None (cancel) or a number from 0 up to the largest cost."""
    if actual_cost is None:
        return None
    if isinstance(actual_cost, bool) or not isinstance(actual_cost, (int, float)):
        raise InvalidRequest(f"must be a number, not {type(actual_cost).__name__}", "actual_cost")
    if not 0 <= actual_cost <= LARGEST_NUMBER:  # also true for NaN
        raise InvalidRequest(f"must be at least 0 and at most {LARGEST_NUMBER:.0e}, got {actual_cost!r}", "actual_cost")
    return actual_cost


def clean_reservation_id(reservation_id: Any) -> str:
    if not isinstance(reservation_id, str):
        raise InvalidRequest(f"must be a string, not {type(reservation_id).__name__}", "reservation_id")
    return reservation_id
