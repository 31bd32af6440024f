"""The decision: the answer to "may this request go?"."""

from __future__ import annotations

import math
from typing import NamedTuple, final

OK, RATE_LIMITED, COST_EXCEEDS_LIMIT = "OK", "RATE_LIMITED", "COST_EXCEEDS_LIMIT"
STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
NO_NAMES: tuple[str, ...] = ()
INFINITY = math.inf


@final  # so that `type(x) is Decision` tells a Decision from a store's Finding, for mypy too
class Decision(NamedTuple):
    """The answer to "may this request go?".

    allowed: whether it may go now. retry_after: seconds to wait, 0 when allowed,
    math.inf when it can never fit. blocked_by: "level: rule", the rule with the longest
    wait. reason: "OK", the blocking rule's label, RATE_LIMITED or COST_EXCEEDS_LIMIT.
    remaining: the tightest rule's room after this decision. degraded: decided by a fail
    mode because the store was down. lease: hand it to `release()` when a concurrency slot
    was taken. shadow_blocked: the shadow rules that would have denied.

    Two decisions are equal when all but their leases are: a lease id is unique by design.
    """

    allowed: bool
    retry_after: float = 0.0
    blocked_by: str | None = None
    reason: str = OK
    remaining: float = INFINITY
    degraded: bool = False
    lease: str | None = None
    shadow_blocked: tuple[str, ...] = NO_NAMES

    def as_dict(self) -> dict:
        return self._asdict()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return self[:6] == other[:6] and self[7] == other[7]

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        # What __eq__ compares, and nothing else: equal decisions hash alike.
        return hash((self[:6], self[7]))

    def __repr__(self) -> str:
        if self.allowed:
            return f"<Decision allowed remaining={self.remaining!r}>"
        return f"<Decision denied {self.reason} by {self.blocked_by!r} retry_after={self.retry_after!r}>"


# Builds a Decision from a full tuple without a Python-level __new__: the hot path's way.
_make = tuple.__new__


def allowed(remaining: float) -> Decision:
    """The plain allowed decision, built the fast way (the hot path's)."""
    return _make(Decision, (True, 0.0, None, OK, remaining, False, None, NO_NAMES))
