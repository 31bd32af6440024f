"""The rate-limit header fields of an answer, from a `core.Decision`.

Follows the IETF draft "RateLimit header fields for HTTP" (draft-ietf-httpapi-ratelimit-headers,
revision 10), whose fields are Structured Field Lists of one item each here:

    RateLimit-Policy: "default";q=10;w=1     the policy: quota q per window of w seconds
    RateLimit: "default";r=0;t=3             the service limit now: r left, more in t seconds
    Retry-After: 3                           (RFC 9110 delay-seconds; denials only)

`ratelimit_headers(decision, quota, window, name)` returns at most the first two, exactly so:

- `RateLimit-Policy` is present when `quota` is a finite number: `q` is the quota rounded down
  (never negative), then `;w=` the window rounded up to a whole second (at least 1) when
  `window` is a finite number greater than 0, left out otherwise.
- `RateLimit` is present unless the decision is allowed with `remaining` unbounded (nothing
  limited the request: no rule applied, or a fail-open decision while the store was down).
  `r` is `remaining` rounded down, capped at `q` and never negative (0 when a denial reports
  no bound). `;t=` is only on denials that can ever fit: `retry_after` in whole seconds,
  rounded up, the same number as `Retry-After`. An allowed answer carries no `t`: a decision
  says how long to wait, not when the room it used comes back.
- The policy name is an sf-string: `"` and `\\` are escaped; other characters must be
  printable ASCII (ValueError otherwise).

`retry_after_header(seconds)` is the `Retry-After` value: whole seconds, rounded up, "0" for
no wait; ValueError for an infinite wait, which has no Retry-After (leave the field out).

    headers = ratelimit_headers(decision, quota=10, window=1)
    if not decision.allowed and math.isfinite(decision.retry_after):
        headers["Retry-After"] = retry_after_header(decision.retry_after)

`advertised_policy(rules)` gives the `(quota, window)` to advertise for a list of engine rules;
`sf_string(name)` is a policy name as the fields spell it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from core import Decision, Rule

# Structured Field Integers have at most 15 digits.
SF_INTEGER_MAX = 999_999_999_999_999
# The engine's own slack (core.rules.EPSILON): a wait of 3.000000000001 s, float noise on an
# exact 3 s, is "3", not "4". A client that comes back after 3 s finds the cost fits.
ROUNDING_SLACK = 1e-9


def ratelimit_headers(
    decision: Decision, quota: float | None, window: float | None, name: str = "default"
) -> dict[str, str]:
    """`RateLimit-Policy` and `RateLimit` for one decision under one policy (see the module)."""
    item = sf_string(name)
    headers = {}
    units = quota_units(quota)
    if units is not None:
        headers["RateLimit-Policy"] = policy_item(item, units, window)
    limit = limit_item(decision, item, units)
    if limit is not None:
        headers["RateLimit"] = limit
    return headers


# The pieces of `ratelimit_headers`, for callers that work out a policy's items once and
# answer many decisions under it (policies.api.answers): `item` is already an sf-string.


def quota_units(quota: float | None) -> int | None:
    """`q`: the quota rounded down, never negative; None when there is no finite quota."""
    if quota is None or not math.isfinite(quota):
        return None
    return whole_units(quota)


def whole_units(quota: float) -> int:
    """`q` of a finite quota: rounded down, never negative."""
    return _whole(math.floor(quota))


def policy_item(item: str, units: int, window: float | None) -> str:
    """One `RateLimit-Policy` item: `q`, then `w` when the window is finite and positive."""
    policy = f"{item};q={units}"
    if window is not None and math.isfinite(window) and window > 0:
        policy += f";w={max(1, _whole(math.ceil(window - ROUNDING_SLACK)))}"
    return policy


def limit_item(decision: Decision, item: str, units: int | None) -> str | None:
    """The `RateLimit` item of one decision; None when it is allowed with no bound."""
    remaining = decision.remaining
    if math.isinf(remaining) and decision.allowed:
        return None
    if units is not None:
        remaining = min(remaining, units)
    left = _whole(math.floor(remaining)) if math.isfinite(remaining) else 0
    if not decision.allowed and math.isfinite(decision.retry_after):
        return f"{item};r={left};t={retry_after_header(decision.retry_after)}"
    return f"{item};r={left}"


def retry_after_header(seconds: float) -> str:
    """`Retry-After` in whole seconds, rounded up; "0" for no wait. An infinite wait has
    no Retry-After: ValueError."""
    if not math.isfinite(seconds):
        raise ValueError(f"no Retry-After for a wait of {seconds!r}: the request can never fit")
    if seconds <= 0:
        return "0"
    return str(_whole(math.ceil(seconds - ROUNDING_SLACK)))


def advertised_policy(rules: Iterable[Rule]) -> tuple[float | None, float | None]:
    """The `(quota, window)` to advertise for rules that apply together: the enforced rule
    with the smallest capacity (the first on a tie), since it runs out first after a quiet
    spell. A window rule's window is its own; a bucket's is the time it takes to refill from
    empty (None if it never refills); a concurrency rule has none. `(None, None)` when no
    rule has a finite capacity."""
    enforced = [rule for rule in rules if not rule.shadow and math.isfinite(rule.capacity)]
    if not enforced:
        return None, None
    return rule_quota(min(enforced, key=lambda r: r.capacity))


def rule_quota(rule: Rule) -> tuple[float, float | None]:
    """One rule's `(quota, window)`: a window rule's window is its own; a bucket's is the
    time it takes to refill from empty (None if it never refills); a concurrency rule has none."""
    window = getattr(rule, "window", None)
    if window is None and not rule.leased:
        rate = getattr(rule, "rate", 0.0)
        window = rule.capacity / rate if rate else None
    return rule.capacity, window


def _whole(value: float) -> int:
    return int(min(max(value, 0), SF_INTEGER_MAX))


def sf_string(name: str) -> str:
    """`name` as a Structured Field String: quoted, `"` and `\\` escaped."""
    if not isinstance(name, str) or not all(" " <= ch <= "~" for ch in name):
        raise ValueError(f"a policy name must be printable ASCII, got {name!r}")
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
