"""What a decision looks like on the wire, whatever carries it: its JSON body and its rate-limit
header fields (the REST API, forward-auth, Envoy's rate limit service and the console).

The fields are those of `policies.headers` (IETF draft-ietf-httpapi-ratelimit-headers), with
one policy item per enforced rule of the request's levels:

    RateLimit-Policy: "user:token_bucket";q=10;w=10, "team:token_bucket";q=100;w=10
    RateLimit: "team:token_bucket";r=0;t=3
    Retry-After: 3                                      (denials only, whole seconds, rounded up)

`RateLimit` reports one of them: on a denial the rule that blocked, otherwise the rule with
the smallest quota, with `r` the decision's `remaining` (the tightest rule's room, rounded
down). The store reports only the tightest room, not which rule holds it, so on an allowed
answer the named rule is a best guess. With LIMITER_OPENAI_HEADERS=1, OpenAI's
`x-ratelimit-*` fields follow (services.openai_headers), from a read of each rule's room.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping

from django.conf import settings

from core import Decision, HierarchicalLimiter
from policies.headers import limit_item, policy_item, retry_after_header, rule_quota, sf_string, whole_units

from .openai_headers import openai_headers

# The error code of a 429 in the one error shape (services.errors.error_body).
RATE_LIMITED = "rate_limited"

# Names the soft quotas a request went past (`over_quota`), on an answer that let it go: a
# structured field's list of strings (RFC 8941), as RateLimit-Policy names its rules.
OVER_QUOTA_HEADER = "X-Limiter-Over-Quota"


def json_number(value: float) -> float | None:
    """JSON has no infinity or NaN: an unbounded value is null."""
    return round(value, 6) if math.isfinite(value) else None


def decision_body(decision: Decision) -> dict:
    return {
        "allowed": decision.allowed,
        "retry_after": json_number(decision.retry_after),
        "blocked_by": decision.blocked_by,
        "reason": decision.reason,
        "remaining": json_number(decision.remaining),
        "degraded": decision.degraded,
        "shadow_blocked": list(decision.shadow_blocked),
        "over_quota": list(decision.over_quota),
    }


def denial_message(decision: Decision) -> str:
    """What a 429's error message says: when to come back, or that the request never fits."""
    if not math.isfinite(decision.retry_after):
        return "Too many requests: this request can never fit the rate limit."
    seconds = retry_after_header(decision.retry_after)
    return f"Too many requests; try again in {seconds} second{'' if seconds == '1' else 's'}."


def explain_rows(rows: list[dict]) -> list[dict]:
    """A dry run's per-rule findings, JSON-safe."""
    return [
        {
            "level": row["level"],
            "key": row["key"],
            "rule": row["rule"],
            "name": row["name"],
            "label": row["label"],
            "shadow": row["shadow"],
            "wait": json_number(row["wait"]),
            "remaining": json_number(row["remaining"]),
        }
        for row in rows
    ]


class _HeaderPlan:
    """The policy items of one limiter and set of levels, worked out once: the whole
    `RateLimit-Policy` value, and for each rule its sf-string item and `q`, so that a
    decision's `RateLimit` is one f-string (the header fields of policies.headers, exactly)."""

    __slots__ = ("policy", "items", "smallest", "quotas", "smallest_quota")

    def __init__(self, items: list[tuple[str, str, float, float | None]]) -> None:
        # Finite quotas only (see _header_plan): each has its whole `q`.
        self.policy = ", ".join(policy_item(sf_string(item), whole_units(q), w) for item, _, q, w in items)
        self.items = {name: (sf_string(item), whole_units(q)) for item, name, q, w in items}
        smallest = min(items, key=lambda i: i[2]) if items else None
        self.smallest = (sf_string(smallest[0]), whole_units(smallest[2])) if smallest else None
        # The same rules as (item, quota, window), for answers that state a limit other ways.
        self.quotas = {name: (item, q, w) for item, name, q, w in items}
        self.smallest_quota = (smallest[0], smallest[2], smallest[3]) if smallest else None


# The header plans of each limiter, by the levels a request names; they go when it goes
# (a policy reload compiles new limiters).
_HEADER_PLANS: weakref.WeakKeyDictionary[HierarchicalLimiter, dict[tuple[str, ...], _HeaderPlan]] = (
    weakref.WeakKeyDictionary()
)


def _header_plan(limiter: HierarchicalLimiter, levels: tuple[str, ...]) -> _HeaderPlan:
    cache = _HEADER_PLANS.get(limiter)
    if cache is None:
        cache = _HEADER_PLANS.setdefault(limiter, {})
    plan = cache.get(levels)
    if plan is None:
        items = []
        for level in levels:
            rules = [rule for rule in limiter.levels.get(level, []) if not rule.shadow]
            types = [rule.type_name for rule in rules]
            for i, rule in enumerate(rules):
                quota, window = rule_quota(rule)
                if not math.isfinite(quota):
                    continue
                item = f"{level}:{rule.type_name}" + (f"#{i}" if types.count(rule.type_name) > 1 else "")
                items.append((item, f"{level}: {rule.display()}", quota, window))
        plan = cache[levels] = _HeaderPlan(items)
    return plan


def decision_headers(limiter: HierarchicalLimiter, keys: Mapping[str, str], decision: Decision) -> dict:
    plan = _header_plan(limiter, tuple(keys))
    headers = {}
    if plan.smallest is not None:
        blocking = plan.items.get(decision.blocked_by) if decision.blocked_by is not None else None
        item, units = blocking or plan.smallest
        headers["RateLimit-Policy"] = plan.policy
        limit = limit_item(decision, item, units)
        if limit is not None:
            headers["RateLimit"] = limit
    if not decision.allowed and math.isfinite(decision.retry_after):
        headers["Retry-After"] = retry_after_header(decision.retry_after)
    if decision.over_quota:
        headers[OVER_QUOTA_HEADER] = ", ".join(sf_string(name) for name in decision.over_quota)
    if settings.LIMITER_OPENAI_HEADERS:
        headers.update(openai_headers(limiter, keys))
    return headers


def binding_quota(
    limiter: HierarchicalLimiter, levels: tuple[str, ...], decision: Decision
) -> tuple[str, float, float | None] | None:
    """The rule that `RateLimit` names for `decision` under `levels` (the one that blocked,
    when it is one of theirs, else the smallest quota) as `(item, quota, window)`: what
    another protocol's answer states as the limit. None when no rule has a finite quota."""
    plan = _header_plan(limiter, levels)
    found = plan.quotas.get(decision.blocked_by) if decision.blocked_by is not None else None
    return found or plan.smallest_quota
