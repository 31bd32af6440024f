"""What the tenant page shows of a tenant's quotas: used against the limit, when the period
resets in the quota's own time zone, when it runs out at the period's pace so far, and a
burn-down chart of the period (what is left after each minute or hour), from the services
behind GET /api/v1/tenants/{key}/quotas and /usage.

The burn-down is drawn from the tenant's usage series (the cost its allowed decisions took,
per minute for a day or less, per hour beyond), so it shows the period's shape; the figures
above it are the quota's own, read live from the store.
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from zoneinfo import ZoneInfo

from core import StoreUnavailable
from policies.services.alerts import tenants_near_quota
from policies.services.quotas import tenant_quotas
from policies.services.usage import USAGE_HOURS, USAGE_MINUTES, usage_series

from .formatting import duration, percent, tenant_url, two_decimals

# At or above these shares of its limit a quota is drawn as nearly spent, then spent.
WARN, SPENT = 80.0, 100.0
NEAR_SHOWN = 10  # tenants listed on the dashboard as close to their quota


def quota_context(key: str, now: float) -> dict[str, Any]:
    """The page's quotas section: {"quotas": [...]}, or {"unavailable": why}."""
    try:
        quotas = tenant_quotas(key, now)
    except StoreUnavailable as error:
        return {"unavailable": f"the quotas cannot be read: {error}"}
    return {"quotas": [_row(key, quota, now) for quota in quotas]}


def _row(key: str, quota: dict[str, Any], now: float) -> dict[str, Any]:
    zone = ZoneInfo(quota["timezone"])
    share = percent(quota["used"], quota["limit"])
    exhaustion = quota["projected_exhaustion"]
    return {
        **quota,
        "used": two_decimals(quota["used"]),
        "remaining": two_decimals(quota["remaining"]),
        "share": share,
        "bar": min(share, 100.0),
        "state": "spent" if share >= SPENT else "warning" if share >= WARN else "ok",
        "resets": _local(quota["resets_at"], zone),
        "resets_in": duration(quota["resets_at"] - now) if quota["resets_at"] is not None else None,
        "runs_out": _local(exhaustion, zone),
        "runs_out_in": duration(exhaustion - now) if exhaustion is not None else None,
        "credits": quota["period"] == "none",
        "chart": _burn_down(key, quota, zone),
        "chart_id": f"quota-{quota['position']}",
        "chart_data_id": f"quota-{quota['position']}-data",
    }


def _local(epoch: float | None, zone: ZoneInfo) -> str | None:
    if epoch is None:
        return None
    return dt.datetime.fromtimestamp(epoch, zone).strftime("%Y-%m-%d %H:%M %Z")


def _burn_down(key: str, quota: dict[str, Any], zone: ZoneInfo) -> dict[str, Any] | None:
    """Chart.js data: what was left of the limit after each step of the period so far."""
    start, end = quota["period_start"], quota["resets_at"]
    if start is None or end is None:
        return None  # credits: no period to draw
    span = end - start
    step = 60 if span <= min(USAGE_MINUTES, 86400) else 3600
    window = int(min(span, USAGE_MINUTES if step == 60 else USAGE_HOURS))
    try:
        usage = usage_series(key, window, step, top=1)
    except StoreUnavailable:
        return None
    points = [p for p in usage["series"] if start <= p["start"] < end]
    left, data, labels = float(quota["limit"]), [], []
    for point in points:
        left -= point["cost"]
        data.append(round(left, 2))
        labels.append(dt.datetime.fromtimestamp(point["start"], zone).strftime("%m-%d %H:%M"))
    return {
        "type": "line",
        "labels": labels,
        "datasets": [{"label": "left of the limit", "data": data, "colour": "hsl(210, 60%, 45%)"}],
        "y": "cost units",
    }


def near_quota_context(now: float) -> dict[str, Any]:
    """The dashboard's "close to their quota" table: the tenants whose quotas reached WARN
    percent in their current periods (as the alert rounds last found them, for the tenants
    with traffic), each with its fullest quota read live; {"rows", "total"}."""
    tenants, total = tenants_near_quota(now, NEAR_SHOWN)
    return {"rows": [_near_row(tenant, band, now) for tenant, band in tenants], "total": total}


def _near_row(tenant: str, band: int, now: float) -> dict[str, Any]:
    row: dict[str, Any] = {"tenant": tenant, "tenant_url": tenant_url(tenant), "band": band}
    try:
        quotas = tenant_quotas(tenant, now)
    except StoreUnavailable:
        return {**row, "unavailable": True}
    if not quotas:  # its quotas were removed since the band was noted
        return row
    fullest = max(quotas, key=lambda quota: percent(quota["used"], quota["limit"]))
    share = percent(fullest["used"], fullest["limit"])
    resets = fullest["resets_at"]
    return {
        **row,
        "rule": f"{fullest['level']}: {fullest['rule']}",
        "used": two_decimals(fullest["used"]),
        "limit": two_decimals(fullest["limit"]),
        "share": share,
        "state": "spent" if share >= SPENT else "warning" if share >= WARN else "ok",
        "resets_in": duration(resets - now) if resets is not None else None,
    }
