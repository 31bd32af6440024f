"""Who is being throttled, and a tenant's traffic over time: the reports behind
GET /api/v1/stats/blocked, GET /api/v1/tenants/{key}/usage and the console's panels.

The numbers are the process's decision statistics (policies.telemetry), which add up every
worker's counts; nothing here counts on its own. Windows are read as the REST API's query
strings spell them (`5m`, `1h`, `24h`, or seconds; policies.durations), by the API, the console
and the commands.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings

from ..compile import policy_cache
from ..durations import WINDOW_PATTERN, duration_text, window_pattern, window_seconds
from ..telemetry import denial_stats
from .errors import invalid, not_found

MAX_TOP = 100

# A tenant's usage: per minute for LIMITER_USAGE_MINUTE_HOURS, per hour for LIMITER_USAGE_HOUR_DAYS.
USAGE_MINUTES = int(settings.LIMITER_USAGE_MINUTE_HOURS * 3600)
USAGE_HOURS = int(settings.LIMITER_USAGE_HOUR_DAYS * 86400)
USAGE_WINDOW_PATTERN = window_pattern(USAGE_HOURS)
USAGE_STEPS = {"1m": 60, "1h": 3600}
USAGE_TOP_USERS = 10


def parse_window(value: Any, pattern: str = WINDOW_PATTERN, most: str = "24h") -> int:
    """`300`, `300s`, `5m`, `1h` or `24h`: seconds, 1 to 86,400 (or what `pattern` allows)."""
    seconds = window_seconds(value, pattern)
    if seconds is None:
        raise invalid("window", f"must be a duration from 1s to {most}, like 300, 5m or 1h; got {value!r}")
    return seconds


def blocked_report(window: int, top: int = 10, step: int | None = None) -> dict:
    """Denials by blocked_by, the most throttled tenants and keys, over the last `window`
    seconds (`step`: seconds per point of the series, a multiple of 60)."""
    return denial_stats().report(window, top=top, step=step)


def parse_top(value: str) -> int:
    """The `top` query parameter: a whole number from 1 to MAX_TOP, in ASCII digits."""
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= MAX_TOP:  # not "²" or "٣"
        raise invalid("top", f"must be a whole number from 1 to {MAX_TOP}")
    return int(value)


def parse_usage_query(query: Mapping[str, str]) -> tuple[int, int]:
    """(window, step) in seconds from `window` (1s up to the hours kept, default 24h) and
    `step` (`1m` or `1h`; by default 1m when the window fits the minutes kept, else 1h)."""
    window = parse_window(query.get("window", "24h"), USAGE_WINDOW_PATTERN, duration_text(USAGE_HOURS))
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


def usage_series(key: str, window: int, step: int, top: int = USAGE_TOP_USERS) -> dict:
    """A tenant's usage as the statistics keep it, with `has_traffic` (no 404, no tier filled
    in): what the console's tenant page reads for each of its windows."""
    return denial_stats().usage(key, window, step, top)


def seen_users(prefix: str, limit: int = 10) -> list[dict[str, Any]]:
    """Users seen recently whose key starts with `prefix`, most recent first."""
    return denial_stats().seen_users(prefix, limit)
