"""The tenant page at /admin/dashboard/tenants/<key>/: one tenant's rules, live buckets and
traffic, and a quick raise of one of its limits.

It shows the effective rules of each level with where they come from (the tier, the tenant's
override and its expiry, or the global rules), the team key's live buckets (the dashboard's
bucket panel, refreshing itself), allowed against denied per minute over 24 h and per hour
over 30 days, the denials by blocked_by, shadow rules' would-be denials, and the most
throttled users. The numbers come from the services behind the REST read-outs
(`DenialStats.usage`, GET /api/v1/tenants/{key}/usage; `bucket_report`); the raise goes
through `policies.overrides.raise_limit`. Wired up by `LimiterAdminSite.get_urls()`.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django import forms
from django.contrib import messages
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from core import StoreUnavailable
from policies.api.inspection import USAGE_HOURS, USAGE_MINUTES, rule_sources
from policies.api.observe import denial_stats
from policies.api.requests import MAX_KEY_LENGTH
from policies.changes import Names, previous_records, record_changes, sentence_parts
from policies.compile import TENANT_LEVEL, policy_cache
from policies.models import StaleVersion, Tenant
from policies.overrides import MAX_FACTOR, MAX_HOURS, QuickRaiseRefused, raisable, raise_limit, why_not

from .actions import log_console_action
from .dashboard import (
    PARTIALS,
    REFRESH,
    BucketQuery,
    _allow,
    _change_url,
    _local,
    bucket_context,
    bucket_url,
    rule_colour,
    tenant_url,
)

TOP_USERS = 10
RECENT_CHANGES = 10
SERIES_COLOURS = {"allowed": "hsl(140, 45%, 40%)", "denied": "hsl(3, 70%, 50%)", "shadow_denied": "hsl(45, 85%, 45%)"}
FACTORS = (1.5, 2, 5, 10)
DEFAULT_HOURS = 4
STALE = (
    "This tenant or its rules changed since you opened the page (someone else saved it, or a "
    "policy file was loaded). Nothing was raised: look at the rules below and try again."
)


class RaiseForm(forms.Form):
    """A quick raise: one rule at one level, by a factor, for some hours; `version` is the
    tenant's when the page was shown (0: no tenant row yet)."""

    key = forms.CharField(max_length=MAX_KEY_LENGTH, strip=False)
    level = forms.CharField(max_length=64)
    rule = forms.CharField(max_length=500, strip=False)
    factor = forms.FloatField(min_value=1.0, max_value=MAX_FACTOR)
    hours = forms.IntegerField(min_value=1, max_value=MAX_HOURS)
    version = forms.IntegerField(min_value=0)

    def clean_factor(self):
        factor = self.cleaned_data["factor"]
        if factor <= 1:
            raise forms.ValidationError("must be more than 1")
        return factor


class TenantViews:
    """The tenant page and its quick raise, for one admin site."""

    def __init__(self, site) -> None:
        self.site = site

    def page(self, request, key):
        refused = _allow(request, "GET", "HEAD")
        if refused:
            return refused
        context = {
            **self.site.each_context(request),
            **tenant_context(key),
            "title": f"Tenant {key}",
            "refresh": REFRESH,
            "factors": FACTORS,
            "default_hours": DEFAULT_HOURS,
            "max_hours": MAX_HOURS,
        }
        return TemplateResponse(request, PARTIALS + "tenant.html", context)

    def raise_limit(self, request):
        """POST (with the CSRF token, as admin_view requires): raise, log it, back to the page."""
        refused = _allow(request, "POST")
        if refused:
            return refused
        form = RaiseForm(request.POST)
        if not form.is_valid():
            problems = "; ".join(
                f"{name}: {' '.join(str(error) for error in errors)}" for name, errors in form.errors.items()
            )
            messages.error(request, f"Nothing was raised: {problems}.")
            key = request.POST.get("key")
            return HttpResponseRedirect(tenant_url(key) if key else reverse("admin:dashboard"))
        data = form.cleaned_data
        try:
            # The policy's own clock: the one that decides when the override stops applying.
            now = datetime.fromtimestamp(policy_cache().clock(), UTC)
            raised = raise_limit(
                data["key"], data["level"], data["rule"], data["factor"], data["hours"], data["version"], now
            )
        except StaleVersion:
            messages.error(request, STALE)
        except QuickRaiseRefused as refusal:
            messages.error(request, f"Nothing was raised: {refusal}")
        else:
            _log_raise(request, raised, data)
            # This worker reads the new policy now (the others within CHECK_EVERY), so the page
            # it redirects to shows the override.
            policy_cache().refresh()
            messages.success(
                request,
                f"Raised {raised.level}: {data['rule']} x{data['factor']:g} to {raised.rule} for {data['key']} "
                f"until {_local(raised.until.timestamp()):%Y-%m-%d %H:%M %Z}: "
                "an override that the next decisions use (within a second).",
            )
        return HttpResponseRedirect(tenant_url(data["key"]))


def _log_raise(request, raised, data) -> None:
    """In the admin's log, so that it shows in "Recent actions" under the operator's name."""
    log_console_action(
        request,
        f"raised {raised.level}: {data['rule']} x{data['factor']:g} for {data['hours']} h for {raised.tenant.key} "
        f"(an expiring override, now {raised.rule})",
        raised.tenant.key,
        raised.tenant,
    )


# --- the page's content -------------------------------------------------------------------


def tenant_context(key: str) -> dict:
    """Everything the page shows about team key `key`; Http404 when it is no tenant and has
    no traffic in the last 30 days."""
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
        "overrides_until": _local(tenant_policy.until) if tenant_policy and tenant_policy.until else None,
        "has_overrides": bool(tenant_policy and tenant_policy.overrides),
        "levels": effective_rules(key, policy, tenant),
        "buckets": bucket_context(buckets, policy),
        "windows": [_window("24 h", day, "%H:%M"), _window("30 days", month, "%m-%d %H:00")],
        "breakdown": _by_rule(day, month, "blocked_by"),
        "shadow": _by_rule(day, month, "shadow_blocked_by"),
        "users": _users(key, day),
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
        return denial_stats().usage(key, window, step, top=TOP_USERS)
    except StoreUnavailable as error:
        return f"the statistics cannot be read: {error}"


def _window(label: str, usage: dict | str, stamp: str) -> dict:
    """A window's totals and its chart (Chart.js data: allowed, denied and shadow-denied lines)."""
    if isinstance(usage, str):
        return {"label": label, "unavailable": usage}
    series = usage["series"]
    totals = {field: sum(p[field] for p in series) for field in ("decisions", "allowed", "denied", "shadow_denied")}
    totals["cost"] = round(sum(p["cost"] for p in series), 2)
    datasets = [
        {"label": field.replace("_", " "), "data": [p[field] for p in series], "colour": colour}
        for field, colour in SERIES_COLOURS.items()
        if field != "shadow_denied" or totals["shadow_denied"]
    ]
    chart_id = "usage-" + label.replace(" ", "")
    return {
        "label": label,
        "id": chart_id,
        "data_id": chart_id + "-data",
        "totals": totals,
        "share": totals["denied"] / totals["decisions"] * 100 if totals["decisions"] else 0.0,
        "step": "a minute" if usage["step"] == 60 else "an hour",
        "chart": {
            "type": "line",
            "labels": [_local(p["start"]).strftime(stamp) for p in series],
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
            "share": user["denied"] / user["decisions"] * 100,
        }
        for user in day["top_users"]
        if user["decisions"]
    ]


def _links(key: str, tenant: Tenant | None) -> dict:
    return {
        "buckets": bucket_url(TENANT_LEVEL, key),
        "change": _change_url("tenant", tenant.pk) if tenant else None,
        "history": reverse("admin:policies_tenant_history", args=[tenant.pk]) if tenant else None,
        "tier": _change_url("tier", tenant.tier_id) if tenant else None,
        "usage_api": reverse("api-tenant-usage", args=[key]),
    }
