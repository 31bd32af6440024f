"""A key's live buckets: every rule that applies to it at its level, with its state and where
the rule comes from (the tier, the tenant's override, or the global rules). What
GET /api/v1/buckets answers and the console's bucket panel shows.
"""

from __future__ import annotations

from typing import Any

from ..compile import policy_cache
from ..policy import TENANT_LEVEL, Policy
from .answers import json_number
from .errors import invalid
from .inputs import MAX_KEY_LENGTH


def json_safe(value: Any) -> Any:
    """Rule states may hold infinities; JSON has none (null stands for unbounded)."""
    if isinstance(value, float):
        return json_number(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def rule_sources(policy: Policy, team_key: str | None, now: float) -> tuple[dict, dict[str, list[str]]]:
    """Where each level's rules come from, in the order the limiter holds them: the tier,
    the tenant's override, or the global rules."""
    kind, name = policy.route(team_key, now)
    tenant = policy.tenants.get(team_key) if team_key is not None else None
    tier = tenant.tier if tenant is not None else policy.default_tier
    sources = {}
    overrides = policy.tenants[name].overrides if kind == "tenant" and name is not None else {}
    tier_rules = policy.tiers.get(tier, {}) if tier is not None else {}
    for level in policy.levels:
        overridden = level in overrides
        own = overrides[level] if overridden else tier_rules.get(level, [])
        origin = f"override: {name}" if overridden else f"tier: {tier}"
        sources[level] = [origin] * len(own) + ["global"] * len(policy.global_rules.get(level, []))
    route = {"tenant": tenant and team_key, "tier": tier, "override": kind == "tenant"}
    return route, sources


def bucket_report(level: str, key: str, team: str | None = None) -> dict:
    """Every rule that applies to `key` at `level`, with its live state and origin."""
    cache = policy_cache()
    policy = cache.current()
    if level not in policy.levels:
        raise invalid("level", f"level not configured (configured: {', '.join(policy.levels) or 'none'})")
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise invalid("key", f"must be 1 to {MAX_KEY_LENGTH} characters")
    team_key = key if level == TENANT_LEVEL else team
    route, sources = rule_sources(policy, team_key, cache.clock())
    rows = cache.limiter_for(team_key).inspect(level, key)
    rules = [
        {
            "rule": row["rule"],
            "name": row["name"],
            "label": row["label"],
            "shadow": row["shadow"],
            "source": sources[level][row["position"]],
            "state": json_safe(row["state"]),
        }
        for row in rows
    ]
    return {"level": level, "key": key, **route, "rules": rules}
