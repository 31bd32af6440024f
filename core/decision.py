"""The decision: the answer to "may this request go?"."""

from __future__ import annotations

import math
from typing import Any, NamedTuple, final

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
    was taken. shadow_blocked: the shadow rules that would have denied. over_quota: the soft
    quotas this request took past (or further past) their limit, named as in blocked_by.

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
    over_quota: tuple[str, ...] = NO_NAMES

    def as_dict(self) -> dict:
        return self._asdict()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return self[:6] == other[:6] and self[7:] == other[7:]

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        # What __eq__ compares, and nothing else: equal decisions hash alike.
        return hash((self[:6], self[7:]))

    def __repr__(self) -> str:
        if self.allowed:
            return f"<Decision allowed remaining={self.remaining!r}>"
        return f"<Decision denied {self.reason} by {self.blocked_by!r} retry_after={self.retry_after!r}>"


class Finding(NamedTuple):
    """What a store found for one decision, by check index, before the limiter names it.

    blocker: the index of the check that denied, or -1. wait: its wait. remaining: the room
    of the tightest enforced rule (of the blocker, on a denial). shadows: the indices of the
    shadow checks that would have denied. over: the indices of the soft checks that this
    decision took past their limit (only ever when it took: a denial takes nothing). A store
    answers a plain allowed decision with the finished Decision instead (`allowed(remaining)`),
    which saves the limiter a step.
    """

    blocker: int
    wait: float
    remaining: float
    shadows: tuple[int, ...]
    over: tuple[int, ...]


NO_SHADOWS: tuple[int, ...] = ()

# The constructors below build from a full tuple without a Python-level __new__ (the hot
# path's way). This module alone builds a Decision or a Finding positionally: the field order
# is known here and nowhere else.
_new = tuple.__new__


def allowed(
    remaining: float,
    lease: str | None = None,
    shadow_blocked: tuple[str, ...] = NO_NAMES,
    over_quota: tuple[str, ...] = NO_NAMES,
) -> Decision:
    """An allowed decision with `remaining` room; `lease` when it took a concurrency slot."""
    return _new(Decision, (True, 0.0, None, OK, remaining, False, lease, shadow_blocked, over_quota))


def denied(
    wait: float, blocked_by: str | None, reason: str, remaining: float, shadow_blocked: tuple[str, ...] = NO_NAMES
) -> Decision:
    """A denial: wait `wait` seconds for the rule `blocked_by` (its label or RATE_LIMITED). It
    took nothing, so it took no soft quota over its limit."""
    return _new(Decision, (False, wait, blocked_by, reason, remaining, False, None, shadow_blocked, NO_NAMES))


def degraded_allowed(remaining: float = INFINITY) -> Decision:
    """Allowed by a fail mode while the store is down (an open level)."""
    return _new(Decision, (True, 0.0, None, OK, remaining, True, None, NO_NAMES, NO_NAMES))


def degraded_denied(wait: float, blocked_by: str) -> Decision:
    """Denied by a fail mode while the store is down (a closed level): STORE_UNAVAILABLE."""
    return _new(Decision, (False, wait, blocked_by, STORE_UNAVAILABLE, 0.0, True, None, NO_NAMES, NO_NAMES))


def found(
    blocker: int,
    wait: float,
    remaining: float,
    shadows: tuple[int, ...] = NO_SHADOWS,
    over: tuple[int, ...] = NO_SHADOWS,
) -> Finding:
    """What a store found: `blocker` -1 when every enforced rule fits."""
    return _new(Finding, (blocker, wait, remaining, shadows, over))


def inline_allowed(remaining: str) -> tuple[str, dict[str, Any]]:
    """For generated code: the source of an expression that builds `allowed(<remaining>)`
    in place (no call), and the names it reads. Derived from Decision's fields and their
    defaults, so that a field added or moved moves here too."""
    values = {**Decision._field_defaults, "allowed": True}
    names: dict[str, Any] = {"new_decision": _new, "Decision": Decision}
    items = []
    for field in Decision._fields:
        if field == "remaining":
            items.append(remaining)
        elif _literal(values[field]):
            items.append(repr(values[field]))  # a constant in the code: cheaper to load than a name
        else:
            items.append(f"decision_{field}")
            names[f"decision_{field}"] = values[field]
    return f"new_decision(Decision, ({', '.join(items)},))", names


def _literal(value: Any) -> bool:
    """Whether repr(value) is source that gives back an equal value."""
    if value is None or type(value) in (bool, int, str):
        return True
    if type(value) is float:
        return math.isfinite(value)
    return type(value) is tuple and all(_literal(item) for item in value)
