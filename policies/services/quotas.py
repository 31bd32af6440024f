"""A tenant's budgets: its quotas as they stand (used, remaining, when they reset, when they run
out at this pace), and topping up a balance of credits.

    tenant_quotas("acme")            # [{"level": "team", "rule": "quota(10000000/month)", ...}]
    top_up("acme", "team", "CREDITS", 500_000, by="operator")

A tenant's quotas are the quota rules of its team key's level (its tier's, or its override's),
read live from the store. A user-level quota is each user's own (GET /api/v1/buckets shows it);
a global one is everyone's (the same, at level global).
"""

from __future__ import annotations

import math
from typing import Any

from django.db import transaction

from core import InvalidRequest, Rule
from core.periods import projected_exhaustion

from ..compile import policy_cache
from ..models import CreditTopUp
from ..policy import TENANT_LEVEL
from .errors import conflict, invalid, not_found
from .inputs import MAX_KEY_LENGTH, number

QUOTA = "quota"


def is_quota(rule: Rule) -> bool:
    return rule.type_name == QUOTA


def tenant_quotas(key: str, now: float | None = None) -> list[dict[str, Any]]:
    """Every quota of team key `key` at the tenant's level, as it stands now. Raises
    StoreUnavailable when the store cannot be read."""
    check_key(key)
    limiter = policy_cache().limiter_for(key)
    rules = limiter.levels.get(TENANT_LEVEL, [])
    if not any(is_quota(rule) for rule in rules):
        return []
    now = policy_cache().clock() if now is None else now
    quotas = []
    for row in limiter.inspect(TENANT_LEVEL, key):
        rule = rules[row["position"]]
        if not is_quota(rule):
            continue
        state = row["state"]
        quotas.append(
            {
                "level": TENANT_LEVEL,
                "rule": row["name"].split(": ", 1)[1],
                "label": row["label"],
                "position": row["position"],
                "mode": state["mode"],
                "period": state["period"],
                "timezone": state["timezone"],
                "limit": state["limit"],
                "used": state["used"],
                "remaining": state["remaining"],
                "period_start": state["period_start"],
                "resets_at": state["resets_at"],
                "projected_exhaustion": projected_exhaustion(
                    state["used"], state["limit"], state["period_start"], state["resets_at"], now
                ),
            }
        )
    return quotas


def check_key(key: Any, field: str = "key") -> str:
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise invalid(field, f"must be 1 to {MAX_KEY_LENGTH} characters")
    return key


TOP_UP_FIELDS = ("level", "rule", "add")


def parse_top_up(data: Any) -> tuple[str, str | int, float]:
    """(level, rule, amount) from a top-up request (`{"level", "rule", "add"}`); Invalid naming
    the field else. `rule` is a quota's label or its index among the level's rules."""
    if not isinstance(data, dict):
        raise invalid("", "the body must be a JSON object")
    for name in data:
        if name not in TOP_UP_FIELDS:
            raise invalid(name, f"unknown field (known: {', '.join(TOP_UP_FIELDS)})")
    for name in TOP_UP_FIELDS:
        if name not in data:
            raise invalid(name, "this field is required")
    level, rule = data["level"], data["rule"]
    if not isinstance(level, str) or not level:
        raise invalid("level", "must be a level's name")
    if isinstance(rule, bool) or not isinstance(rule, (str, int)) or rule == "":
        raise invalid("rule", "must be the quota's label or its index among the level's rules")
    return level, rule, number(data["add"], "add")


def top_up(key: str, level: str, rule: str | int, amount: float, by: str, user: Any = None) -> dict[str, Any]:
    """Add `amount` to the credits of the `period: none` quota `rule` at `level` for team key
    `key`, and record who did it and how much. Answers the balance after. Invalid for a rule
    that is no balance of credits, a bad amount, or a level the policy has not."""
    check_key(key)
    limiter = policy_cache().limiter_for(key)
    if level not in limiter.levels:
        raise invalid("level", f"level not configured (configured: {', '.join(limiter.levels) or 'none'})")
    level_key = key if level == TENANT_LEVEL else None
    if level_key is None:
        raise invalid("level", f"a tenant's credits are at level {TENANT_LEVEL!r}")
    index = rule_index(limiter.levels[level], rule)
    quota = limiter.levels[level][index]
    if not is_quota(quota) or getattr(quota, "period", None) != "none":
        # A conflict with the policy as it stands, as a row still in use is: the request is
        # well formed, the rule it names is no balance.
        raise conflict(f"{quota.display()} is no balance of credits (a quota with period: none)", "rule")
    # The record first, the credits inside its transaction: a store that refuses leaves no
    # record. (A database that fails to commit after the store took the credits would leave
    # credits with no record: the one order that cannot lose a top-up an operator paid for.)
    with transaction.atomic():
        record = CreditTopUp.objects.create(
            tenant_key=key, level=level, rule=quota.display(), amount=amount, user=user, by=by[:150]
        )
        try:
            balance = limiter.top_up(level, key, index, amount)
        except InvalidRequest as error:
            raise invalid(error.field or "add", error.reason) from None
        record.balance = balance
        record.save(update_fields=["balance"])
    return {"tenant": key, "level": level, "rule": quota.display(), "added": amount, "balance": json_float(balance)}


def rule_index(rules: list[Rule], rule: str | int) -> int:
    """The index of `rule` (a label, or an index) among a level's rules; NotFound else."""
    if isinstance(rule, int):
        if 0 <= rule < len(rules):
            return rule
        raise not_found(f"no rule {rule} at this level (it has {len(rules)})", "rule")
    found = [i for i, candidate in enumerate(rules) if candidate.label == rule]
    if not found:
        labels = ", ".join(sorted({r.label for r in rules if r.label})) or "none"
        raise not_found(f"no rule labelled {rule!r} at this level (labels: {labels})", "rule")
    return found[0]


def json_float(value: float) -> float | None:
    return value if math.isfinite(value) else None
