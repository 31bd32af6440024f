"""The operators' read-outs: a key's live buckets, who is being throttled by what, and a
tenant's usage over time.

The dashboard shows the same data through the same functions (`bucket_report`,
`blocked_report`, `tenant_usage`), so nothing is computed twice.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from policies.compile import TENANT_LEVEL, Policy, policy_cache

from . import schemas
from .answers import json_number
from .auth import IsOperator
from .errors import invalid, not_found
from .observe import denial_stats
from .requests import MAX_KEY_LENGTH
from .schema_hooks import names_of

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_WINDOW = 86_400
MAX_TOP = 100


def whole_numbers_up_to(high: int) -> str:
    """A regular expression for the whole numbers 1 to `high`, written without leading zeros:
    1 to 24 is `[1-9]|1[0-9]|2[0-4]`."""
    digits = str(high)
    shorter = len(digits) - 2  # how many more digits a number shorter than `high` may have
    options = [f"[1-9][0-9]{{0,{shorter}}}" if shorter > 0 else "[1-9]"] if len(digits) > 1 else []
    for i, digit in enumerate(map(int, digits)):
        low = 1 if i == 0 else 0
        if digit > low:  # `high`'s first i digits, then a smaller digit, then any digits
            rest = len(digits) - i - 1
            smaller = f"[{low}-{digit - 1}]" if digit - 1 > low else str(low)
            options.append(digits[:i] + smaller + ("" if rest == 0 else "[0-9]" if rest == 1 else f"[0-9]{{{rest}}}"))
    return "|".join([*options, digits])


def window_pattern(most: int) -> str:
    """1 s to `most` seconds, in whole seconds, minutes, hours or days, as a regular expression."""
    return "|".join(
        f"(?:{whole_numbers_up_to(most // _UNITS[unit])}){unit}{'?' if unit == 's' else ''}"
        for unit in "smhd"
        if most >= _UNITS[unit]
    )


# 1 s to 24 h: the schema states it as this pattern, and `parse_window` reads it with the same one.
WINDOW_PATTERN = window_pattern(MAX_WINDOW)
# A tenant's usage: per minute for LIMITER_USAGE_MINUTE_HOURS, per hour for LIMITER_USAGE_HOUR_DAYS.
USAGE_MINUTES = int(settings.LIMITER_USAGE_MINUTE_HOURS * 3600)
USAGE_HOURS = int(settings.LIMITER_USAGE_HOUR_DAYS * 86400)
USAGE_WINDOW_PATTERN = window_pattern(USAGE_HOURS)
USAGE_STEPS = {"1m": 60, "1h": 3600}
USAGE_TOP_USERS = 10


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


def parse_window(value: Any, pattern: str = WINDOW_PATTERN, most: str = "24h") -> int:
    """`300`, `300s`, `5m`, `1h` or `24h`: seconds, 1 to 86,400 (or what `pattern` allows)."""
    if not isinstance(value, str) or not re.fullmatch(pattern, value):
        raise invalid("window", f"must be a duration from 1s to {most}, like 300, 5m or 1h; got {value!r}")
    number = value.rstrip("smhd")  # whole digits, then one unit at most: the pattern matched
    return int(number) * _UNITS[value[len(number) :]]


def blocked_report(window: int, top: int = 10) -> dict:
    return denial_stats().report(window, top=top)


def _duration_text(seconds: int) -> str:
    return (
        f"{seconds // 86400}d"
        if seconds % 86400 == 0
        else f"{seconds // 3600}h"
        if seconds % 3600 == 0
        else f"{seconds}s"
    )


def parse_usage_query(query) -> tuple[int, int]:
    """(window, step) in seconds from `window` (1s up to the hours kept, default 24h) and
    `step` (`1m` or `1h`; by default 1m when the window fits the minutes kept, else 1h)."""
    window = parse_window(query.get("window", "24h"), USAGE_WINDOW_PATTERN, _duration_text(USAGE_HOURS))
    step = query.get("step")
    if step is None:
        return window, 60 if window <= USAGE_MINUTES else 3600
    if step not in USAGE_STEPS:
        raise invalid("step", f"must be 1m or 1h; got {step!r}")
    return window, USAGE_STEPS[step]


def tenant_usage(key: str, window: int, step: int, top: int = USAGE_TOP_USERS) -> dict:
    """A tenant's usage (core.stats.DenialStats.usage), with the tier it resolves to now when
    the statistics have none. Raises a 404 for a key that is neither a tenant nor seen in the
    window. A step of a minute covers the minutes kept at most: a longer window is cut to them
    (the first point's `start` says where the series begins)."""
    policy = policy_cache().current()
    known = key in policy.tenants
    stats = denial_stats()
    if step == 60:
        window = min(window, USAGE_MINUTES)
    usage = stats.usage(key, window, step, top)
    if not usage.pop("has_traffic") and not known:
        raise _no_tenant(key)
    if usage["tier"] is None:
        usage["tier"] = policy.tenants[key].tier if known else policy.default_tier
    return usage


def _no_tenant(key: str):
    return not_found(f"no tenant {key!r}, and no traffic of that team key in the window", "key")


class BucketsView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        parameters=[
            OpenApiParameter("level", names_of("level"), required=True, description="A configured level."),
            OpenApiParameter(
                "key",
                {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH},
                required=True,
                description="The key at that level.",
            ),
            OpenApiParameter(
                "team", str, description="For user keys: the team whose tier applies (default: the default tier)."
            ),
        ],
        responses={200: OpenApiTypes.OBJECT, **schemas.ERRORS},
        tags=["observe"],
        summary="The live state of every rule for a key",
    )
    def get(self, request):
        query = request.query_params
        for required in ("level", "key"):
            if not query.get(required):
                raise invalid(required, "this query parameter is required")
        team = query.get("team") or None
        return Response(bucket_report(query["level"], query["key"], team))


class BlockedStatsView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "window",
                {"type": "string", "pattern": f"^(?:{WINDOW_PATTERN})$"},
                description="1s to 24h: 5m, 1h, 24h or seconds (default 1h).",
            ),
            OpenApiParameter(
                "top",
                {"type": "integer", "minimum": 1, "maximum": MAX_TOP},
                description=f"Most throttled keys per level (1-{MAX_TOP}, default 10).",
            ),
        ],
        responses={200: schemas.BlockedReport, **schemas.ERRORS, **schemas.UNAVAILABLE},
        tags=["observe"],
        summary="Denials by blocked_by, and the most throttled tenants and keys",
        description="Denials and shadow rules' would-be denials by rule, the tenants with the most denials "
        "at any level (`top_tenants`), and the most denied keys of each level (a user with its team).",
    )
    def get(self, request):
        window = parse_window(request.query_params.get("window", "1h"))
        top = request.query_params.get("top", "10")
        if not top.isascii() or not top.isdigit() or not 1 <= int(top) <= MAX_TOP:  # not "²" or "٣"
            raise invalid("top", f"must be a whole number from 1 to {MAX_TOP}")
        return Response(blocked_report(window, int(top)))


class TenantUsageView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        parameters=[
            OpenApiParameter("key", str, OpenApiParameter.PATH, description="The tenant's team key."),
            OpenApiParameter(
                "window",
                {"type": "string", "pattern": f"^(?:{USAGE_WINDOW_PATTERN})$"},
                description=f"1s to {_duration_text(USAGE_HOURS)}, e.g. 1h, 24h, 30d (default 24h); with step 1m "
                f"the series covers the last {_duration_text(USAGE_MINUTES)} at most (the minutes kept).",
            ),
            OpenApiParameter(
                "step",
                {"type": "string", "enum": list(USAGE_STEPS)},
                description="1m or 1h per point (default: 1m when the window fits the minutes kept, else 1h).",
            ),
        ],
        responses={200: schemas.TenantUsage, **schemas.ERRORS, **schemas.NOT_FOUND, **schemas.UNAVAILABLE},
        tags=["observe"],
        summary="A tenant's decisions, denials, shadow denials and cost over time",
        description="One point per step: decisions, allowed, denied, shadow_denied and cost taken (epoch "
        "`start`). `blocked_by`, `shadow_blocked_by` and `top_users` cover the whole hours the window "
        "touches, from `breakdown_since` (users: the minutes kept at most). 404: no such tenant and no "
        "traffic of that team key in the window.",
    )
    def get(self, request, key):
        window, step = parse_usage_query(request.query_params)
        return Response(tenant_usage(key, window, step))
