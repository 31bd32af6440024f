"""What the tenant page shows about one team key: its effective rules per level and where
they come from (the tier, the tenant's override and its expiry, or the global rules), its
live buckets (the dashboard's bucket panel), allowed against denied per minute over 24 h and
per hour over 30 days, the denials by blocked_by, shadow rules' would-be denials, the
decisions let go past a soft quota, the most throttled users, and its latest changes.

The numbers come from the services behind the REST read-outs (`usage_series`, GET
/api/v1/tenants/{key}/usage; `bucket_report`; `rule_sources`), the changes from the
tenant's history read as sentences (`policies.changes`).
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.http import Http404
from django.urls import reverse

from core import StoreUnavailable
from policies.changes import Names, previous_records, record_changes, sentence_parts
from policies.compile import policy_cache
from policies.models import Tenant
from policies.overrides import raisable, why_not
from policies.policy import TENANT_LEVEL
from policies.services.inspection import rule_sources
from policies.services.usage import USAGE_HOURS, USAGE_MINUTES, usage_series

from .buckets import bucket_context
from .formatting import bucket_url, change_url, local_time, percent, rule_colour
from .forms import BucketQuery
from .quotas import quota_context

TOP_USERS = 10
RECENT_CHANGES = 10
# The short windows, one point a minute (cut from the day's series: no read of their own).
RECENT = {"15m": ("15 min", 15 * 60), "1h": ("1 h", 3600), "6h": ("6 h", 6 * 3600)}
SERIES_COLOURS = {
    "allowed": "hsl(140, 45%, 40%)",
    "denied": "hsl(3, 70%, 50%)",
    "shadow_denied": "hsl(45, 85%, 45%)",
    "over_quota": "hsl(275, 55%, 50%)",
}
# Lines drawn only when they count something: most tenants have no shadow rule and no soft quota.
WHEN_NOT_ZERO = ("shadow_denied", "over_quota")


def tenant_context(key: str, recent: str | None = None) -> dict:
    """Everything the page shows about team key `key`, its short chart over `recent` (a key of
    RECENT; by default the shortest with traffic); Http404 when it is no tenant and has no
    traffic in the last 30 days."""
    cache = policy_cache()
    policy = cache.current()
    tenant = Tenant.objects.select_related("tier").filter(key=key).first()
    day, month = _usage(key, USAGE_MINUTES if USAGE_MINUTES < 86400 else 86400, 60), _usage(key, USAGE_HOURS, 3600)
    seen = any(isinstance(u, dict) and u["has_traffic"] for u in (day, month))
    if tenant is None and not seen and all(isinstance(u, dict) for u in (day, month)):
        raise Http404(f"No tenant {key!r}, and no traffic of that team key in the last 30 days.")
    route, _ = rule_sources(policy, key, cache.clock())
    tenant_policy = policy.tenants.get(key)
    buckets = BucketQuery({"level": TENANT_LEVEL, "key": key, "team": ""}, policy)
    return {
        "key": key,
        "tenant": tenant,
        "version": tenant.version if tenant else 0,
        "route": route,
        "overrides_until": local_time(tenant_policy.until) if tenant_policy and tenant_policy.until else None,
        "has_overrides": bool(tenant_policy and tenant_policy.overrides),
        "levels": effective_rules(key, policy, tenant),
        "buckets": bucket_context(buckets, policy),
        "recent": _recent(day, recent, cache.clock()),
        "windows": [_usage_window("24 h", day, "%H:%M"), _usage_window("30 days", month, "%m-%d %H:00")],
        "breakdown": _by_rule(day, month, "blocked_by"),
        "shadow": _by_rule(day, month, "shadow_blocked_by"),
        "over_quota": _by_rule(day, month, "over_quota_by"),
        "users": _users(key, day),
        "quotas": quota_context(key, cache.clock()),
        "changes": recent_changes(tenant),
        "links": _links(key, tenant),
    }


def recent_changes(tenant: Tenant | None, limit: int = RECENT_CHANGES) -> list[dict]:
    """The tenant's latest versions, newest first, each as a sentence (its own fields and its
    overrides, diffed against the version before: `policies.changes`), with who made it,
    when, and a link to that version's history page."""
    if tenant is None:
        return []
    records = list(tenant.history.select_related("history_user").order_by("-history_date", "-history_id")[:limit])
    previous = previous_records(records)
    names = Names()
    out = []
    for record in records:
        before, name, after = sentence_parts(
            record, record_changes(record, previous.get(record.history_id), names), names
        )
        out.append(
            {
                "text": (before + name + after)[:1].upper() + (before + name + after)[1:],
                "when": record.history_date,
                "by": record.history_user or record.history_change_reason or "",
                "url": reverse("admin:policies_tenant_simple_history", args=[tenant.pk, record.history_id]),
                "version": record.policy_version,
            }
        )
    return out


def effective_rules(key: str, policy, tenant: Tenant | None = None) -> list[dict]:
    """Each level's rules as the limiter of this team key holds them, with their source, and
    why a quick raise there would be refused whatever its hours (None: it may be made)."""
    cache = policy_cache()
    _, sources = rule_sources(policy, key, cache.clock())
    limiter = cache.limiter_for(key)
    now = datetime.fromtimestamp(cache.clock(), UTC)
    levels = []
    for level in policy.levels:
        refusal = why_not(tenant, level, None, now)
        rules = []
        for rule, source in zip(limiter.levels.get(level, []), sources[level]):
            name = f"{level}: {rule.display()}"
            rules.append(
                {
                    "name": name,
                    "rule": rule.display(),
                    "label": rule.label,
                    "shadow": rule.shadow,
                    "source": source,
                    "colour": rule_colour(name),
                    "raisable": source != "global" and not rule.shadow and raisable(rule.type_name),
                    "refusal": refusal,
                }
            )
        levels.append({"level": level, "rules": rules})
    return levels


def _usage(key: str, window: int, step: int) -> dict | str:
    try:
        return usage_series(key, window, step, top=TOP_USERS)
    except StoreUnavailable as error:
        return f"the statistics cannot be read: {error}"


def _recent(day: dict | str, chosen: str | None, now: float) -> dict:
    """The short chart: the last 15 min, 1 h or 6 h of the day's minutes; unless `chosen`, the
    shortest window with traffic (a tenant throttled a minute ago is more than a spike)."""
    if isinstance(day, str):
        return {"unavailable": day}
    cuts = {name: _last(day, seconds, now) for name, (_, seconds) in RECENT.items()}
    if chosen not in RECENT:
        chosen = next((name for name, cut in cuts.items() if any(p["decisions"] for p in cut["series"])), "15m")
    window = _usage_window(RECENT[chosen][0], cuts[chosen], "%H:%M")
    return {
        **window,
        "id": "usage-recent",
        "data_id": "usage-recent-data",
        "choices": [{"name": name, "label": label, "current": name == chosen} for name, (label, _) in RECENT.items()],
    }


def _last(usage: dict, seconds: int, now: float) -> dict:
    """`usage` cut to its points of the last `seconds`."""
    return {**usage, "series": [p for p in usage["series"] if p["start"] > now - seconds - usage["step"]]}


def _usage_window(label: str, usage: dict | str, stamp: str) -> dict:
    """A window's totals and its chart (Chart.js data: allowed, denied, and the shadow-denied
    and over-quota lines when they are not all zeros)."""
    if isinstance(usage, str):
        return {"label": label, "unavailable": usage}
    series = usage["series"]
    fields = ("decisions", "allowed", "denied", "shadow_denied", "over_quota")
    totals = {field: sum(p[field] for p in series) for field in fields}
    totals["cost"] = round(sum(p["cost"] for p in series), 2)
    datasets = [
        {"label": field.replace("_", " "), "data": [p[field] for p in series], "colour": colour}
        for field, colour in SERIES_COLOURS.items()
        if field not in WHEN_NOT_ZERO or totals[field]
    ]
    chart_id = "usage-" + label.replace(" ", "")
    return {
        "label": label,
        "id": chart_id,
        "data_id": chart_id + "-data",
        "totals": totals,
        "share": percent(totals["denied"], totals["decisions"]),
        "step": "a minute" if usage["step"] == 60 else "an hour",
        "chart": {
            "type": "line",
            "labels": [local_time(p["start"]).strftime(stamp) for p in series],
            "datasets": datasets,
            "y": "decisions",
        },
    }


def _by_rule(day: dict | str, month: dict | str, field: str) -> list[dict]:
    """Each rule's count over 24 h and 30 days ("n/a" where unreadable), most in 24 h first."""
    names: dict[str, None] = {}
    for usage in (day, month):
        if isinstance(usage, dict):
            names.update(dict.fromkeys(usage[field]))
    rows = [
        {
            "name": name,
            "colour": rule_colour(name),
            "counts": [u[field].get(name, 0) if isinstance(u, dict) else "n/a" for u in (day, month)],
        }
        for name in names
    ]
    return sorted(rows, key=lambda row: ([-n if isinstance(n, int) else 0 for n in row["counts"]], row["name"]))


def _users(key: str, day: dict | str) -> list[dict]:
    if isinstance(day, str):
        return []
    return [
        {
            **user,
            "buckets_url": bucket_url("user", user["user"], key),
            "share": percent(user["denied"], user["decisions"]),
        }
        for user in day["top_users"]
        if user["decisions"]
    ]


def _links(key: str, tenant: Tenant | None) -> dict:
    return {
        "buckets": bucket_url(TENANT_LEVEL, key),
        "change": change_url("tenant", tenant.pk) if tenant else None,
        "history": reverse("admin:policies_tenant_history", args=[tenant.pk]) if tenant else None,
        "tier": change_url("tier", tenant.tier_id) if tenant else None,
        "usage_api": reverse("api-tenant-usage", args=[key]),
    }
