"""The operators' dashboard at /admin/dashboard/: who is throttled by what, a key's live
buckets, and whether the limiter is healthy.

Every number comes from the services behind the REST read-outs, never worked out again
here: `bucket_report` (GET /api/v1/buckets), the denial statistics behind GET
/api/v1/stats/blocked, `limiter.explain` (a dry run of POST /api/v1/decisions) and
`limiter.reset`. Nothing scans the store's keys: a page is a few per-key reads and the
statistics report, however many keys the store holds.

The panels are partials that htmx polls and swaps in place; the page itself renders them
all, so it also works without JavaScript. The views are wired up by
`LimiterAdminSite.get_urls()`, each behind `admin_view` (staff only).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from core import InvalidRequest, StoreUnavailable
from core.params import LARGEST_NUMBER
from policies.api.answers import decision_body, explain_rows
from policies.api.errors import APIError
from policies.api.inspection import bucket_report, parse_window
from policies.api.observe import denial_stats
from policies.api.requests import MAX_KEY_LENGTH
from policies.compile import TENANT_LEVEL, policy_cache
from policies.models import Level, PriorityClass, Tenant, Tier

from .actions import log_console_action

# The windows an operator picks from: label, and the chart's step (seconds per bar).
WINDOWS = {"5m": ("5 min", 60), "1h": ("1 h", 60), "24h": ("24 h", 900)}
DEFAULT_WINDOW = "1h"
TOP = 10  # most throttled keys shown per level
MAX_SERIES = 8  # blocked_by rules drawn one by one; the rest are drawn as one "other"
OTHER_COLOUR = "hsl(0, 0%, 60%)"
SEARCH_RESULTS = 8  # suggestions of each kind
# How often each panel refreshes itself (seconds).
REFRESH = {"throttled": 10, "buckets": 3, "health": 5}
FAIL_MODE_MEANING = {
    "open": "allows every request",
    "closed": "denies every request (retry after about 1 s)",
    "local": "limits in each process at {fraction:.0%} of the rules",
}
PARTIALS = "admin/dashboard/"


# --- forms --------------------------------------------------------------------------------


class BucketQuery(forms.Form):
    """A key to look at: its level, the key, and for user keys the team whose tier applies."""

    level = forms.ChoiceField()
    # Not stripped: a key is the gateway's exact string.
    key = forms.CharField(max_length=MAX_KEY_LENGTH, strip=False)
    team = forms.CharField(max_length=MAX_KEY_LENGTH, strip=False, required=False)

    def __init__(self, data, policy, initial=None):
        super().__init__(data, initial=initial or {"level": TENANT_LEVEL})
        # A ChoiceField; Form.fields types each field as Field.
        self.fields["level"].choices = [(level, level) for level in policy.levels]  # type: ignore[attr-defined]

    @property
    def team_key(self) -> str | None:
        """The team key that picks the tenant and tier, as bucket_report reads it."""
        data = self.cleaned_data
        return data["key"] if data["level"] == TENANT_LEVEL else (data.get("team") or None)

    def query(self) -> str:
        data = self.cleaned_data
        return urlencode({"level": data["level"], "key": data["key"], "team": data.get("team") or ""})

    def add_api_error(self, error: APIError | InvalidRequest) -> None:
        """An error of the API's checks, shown on the field it names."""
        fields = error.fields if isinstance(error, APIError) else {error.field: error.reason}
        for name, message in fields.items():
            name = "key" if name.startswith("keys.") else name
            self.add_error(name if name in self.fields else None, message)


class DryRunQuery(BucketQuery):
    cost = forms.FloatField(initial=1)
    priority = forms.ChoiceField(required=False)

    def __init__(self, data, policy, initial=None):
        super().__init__(data, policy, initial)
        # A ChoiceField; Form.fields types each field as Field.
        self.fields["priority"].choices = [("", "none")] + [  # type: ignore[attr-defined]
            (name, name) for name in sorted(policy.priorities)
        ]

    def clean_cost(self):
        cost = self.cleaned_data["cost"]
        if not 0 < cost <= LARGEST_NUMBER:
            raise forms.ValidationError(f"must be more than 0 and at most {LARGEST_NUMBER:.0e}")
        return cost


# --- the views ----------------------------------------------------------------------------


def _allow(request, *methods: str):
    return None if request.method in methods else HttpResponseNotAllowed(methods)


class DashboardViews:
    """The dashboard's pages and partials, for one admin site."""

    def __init__(self, site) -> None:
        self.site = site

    def page(self, request):
        refused = _allow(request, "GET", "HEAD")
        if refused:
            return refused
        policy = policy_cache().current()
        window = _window(request.GET.get("window"))
        reports = denial_reports(WINDOWS)
        asked = "level" in request.GET or "key" in request.GET
        query = BucketQuery(request.GET if asked else None, policy)
        context = {
            **self.site.each_context(request),
            "title": "Dashboard",
            "throttled": throttled_context(reports, window, policy),
            "buckets": bucket_context(query, policy),
            "health": health_context(policy, reports),
            "refresh": REFRESH,
        }
        if "cost" in request.GET:
            context["dry_run"] = dry_run_context(DryRunQuery(request.GET, policy))
        elif query.is_bound and query.is_valid():
            context["dry_run"] = {"form": DryRunQuery(None, policy, initial=query.cleaned_data)}
        return TemplateResponse(request, PARTIALS + "page.html", context)

    def throttled(self, request):
        refused = _allow(request, "GET", "HEAD")
        if refused:
            return refused
        window = _window(request.GET.get("window"))
        context = throttled_context(denial_reports(WINDOWS), window, policy_cache().current())
        return TemplateResponse(request, PARTIALS + "_throttled.html", {"throttled": context, "refresh": REFRESH})

    def buckets(self, request):
        refused = _allow(request, "GET", "HEAD")
        if refused:
            return refused
        policy = policy_cache().current()
        context = bucket_context(BucketQuery(request.GET, policy), policy)
        return TemplateResponse(request, PARTIALS + "_buckets.html", {"buckets": context, "refresh": REFRESH})

    def dry_run(self, request):
        refused = _allow(request, "GET", "HEAD")
        if refused:
            return refused
        context = dry_run_context(DryRunQuery(request.GET, policy_cache().current()))
        return TemplateResponse(request, PARTIALS + "_dry_run.html", {"dry_run": context})

    def health(self, request):
        refused = _allow(request, "GET", "HEAD")
        if refused:
            return refused
        reports = denial_reports({"5m": WINDOWS["5m"], "1h": WINDOWS["1h"]})
        context = health_context(policy_cache().current(), reports)
        return TemplateResponse(request, PARTIALS + "_health.html", {"health": context, "refresh": REFRESH})

    def reset(self, request):
        """GET: what would be reset, and a form to confirm. POST (with the CSRF token, as
        admin_view requires): reset, record it in the admin log, back to the dashboard."""
        refused = _allow(request, "GET", "HEAD", "POST")
        if refused:
            return refused
        policy = policy_cache().current()
        query = BucketQuery(request.POST if request.method == "POST" else request.GET, policy)
        if request.method == "POST" and query.is_valid():
            shown = request.POST.get("shown")
            if shown is not None and shown != shown_rules(query):
                messages.error(
                    request,
                    "Nothing was reset: the rules of this key changed since the page was shown. "
                    "Check the buckets below and confirm again.",
                )
            else:
                try:
                    reset_buckets(request, query)
                except StoreUnavailable as error:
                    messages.error(request, f"Nothing was reset: the store is unreachable ({error}).")
                else:
                    return HttpResponseRedirect(f"{reverse('admin:dashboard')}?{query.query()}#buckets")
        context = {
            **self.site.each_context(request),
            "title": "Reset buckets?",
            "buckets": bucket_context(query, policy),
            "shown": shown_rules(query) if query.is_valid() else "",
            "refresh": REFRESH,
        }
        return TemplateResponse(request, PARTIALS + "reset_confirm.html", context)

    def search(self, request):
        """Suggestions as the operator types: tenants by key prefix (from the database) and
        users seen recently (from the statistics). A partial for htmx, else a page."""
        refused = _allow(request, "GET", "HEAD")
        if refused:
            return refused
        context: dict[str, Any] = {"search": search_context(request.GET.get("q", ""))}
        if request.headers.get("HX-Request"):
            return TemplateResponse(request, PARTIALS + "_search.html", context)
        context.update(self.site.each_context(request), title="Find a tenant or user")
        return TemplateResponse(request, PARTIALS + "search.html", context)


def _window(name: str | None) -> str:
    return name if name in WINDOWS else DEFAULT_WINDOW


# --- panel 1: who is throttled, by what ---------------------------------------------------


def denial_reports(windows) -> dict[str, dict | str]:
    """The denial statistics of each window: its report, or why it cannot be read.

    This is what GET /api/v1/stats/blocked answers (`blocked_report`), asked with a `step`
    so that a 24 h chart has 96 bars rather than 1,440. Each window is read on its own: a
    24 h report that times out still leaves the 5 minutes and the hour to show."""
    reports: dict[str, dict | str] = {}
    for name, (_, step) in windows.items():
        try:
            reports[name] = denial_stats().report(parse_window(name), top=TOP, step=step)
        except StoreUnavailable as error:
            reports[name] = f"the statistics cannot be read: {error}"
    return reports


def throttled_context(reports: dict, window: str, policy) -> dict:
    report = reports[window]
    context = {
        "window": window,
        "window_label": WINDOWS[window][0],
        "windows": [{"name": name, "label": label, "current": name == window} for name, (label, _) in WINDOWS.items()],
    }
    if isinstance(report, str):
        return {**context, "unavailable": report}
    return {
        **context,
        "totals": _totals(reports),
        "rules": _rules_by_window(reports),
        "shadow_rules": _rules_by_window(reports, "shadow_blocked_by"),
        "chart": blocked_chart(report, WINDOWS[window][1]),
        "step_text": _duration(WINDOWS[window][1]),
        "tenants": _top_tenants(report["top_tenants"]),
        "top": _top_keys(report["top_keys"], policy.levels),
    }


def _totals(reports: dict) -> list[dict]:
    return [
        {"label": WINDOWS[name][0], "unavailable": report}
        if isinstance(report, str)
        else {
            "label": WINDOWS[name][0],
            "decisions": report["decisions"],
            "denied": report["denied"],
            "share": _share(report["denied"], report["decisions"]),
        }
        for name, report in reports.items()
    ]


def _rules_by_window(reports: dict, field: str = "blocked_by") -> list[dict]:
    """Each blocked_by (or shadow rule, `field="shadow_blocked_by"`) with its denials in every
    window ("n/a" where a window could not be read), most denied right now first."""
    counts: dict[str, dict[str, int]] = {}
    for name, report in reports.items():
        for row in [] if isinstance(report, str) else report[field]:
            counts.setdefault(row["blocked_by"], {})[name] = row["denied"]
    rows = [
        {
            "blocked_by": rule,
            "colour": rule_colour(rule),
            "counts": [
                by_window.get(name, 0) if isinstance(report, dict) else "n/a" for name, report in reports.items()
            ],
        }
        for rule, by_window in counts.items()
    ]
    return sorted(rows, key=lambda row: ([-n if isinstance(n, int) else 0 for n in row["counts"]], row["blocked_by"]))


def blocked_chart(report: dict, step: int) -> dict:
    """Chart.js data: one stacked series of denials per blocked_by, one bar per step."""
    series = report["series"]
    names = [row["blocked_by"] for row in report["blocked_by"]]
    shown, rest = names[:MAX_SERIES], names[MAX_SERIES:]
    datasets = [
        {"label": name, "data": [point["blocked_by"].get(name, 0) for point in series], "colour": rule_colour(name)}
        for name in shown
    ]
    if rest:
        datasets.append(
            {
                "label": f"{len(rest)} other rules",
                "data": [sum(point["blocked_by"].get(name, 0) for name in rest) for point in series],
                "colour": OTHER_COLOUR,
            }
        )
    labels = [_local(point["at"]).strftime("%H:%M") for point in series]
    return {"labels": labels, "datasets": datasets, "step": step}


def rule_colour(name: str) -> str:
    """A rule's colour, from its name alone: the same on every page, window and refresh."""
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).digest()
    hue = int.from_bytes(digest[:2], "big") * 360 // 65536
    return f"hsl({hue}, {55 + digest[2] % 25}%, {38 + digest[3] % 14}%)"


def _top_tenants(rows: list[dict]) -> list[dict]:
    """The tenants with the most denials at any level, each with its page and buckets."""
    return [
        {**row, "tenant_url": tenant_url(row["tenant"]), "buckets_url": bucket_url(TENANT_LEVEL, row["tenant"])}
        for row in rows
    ]


def _top_keys(top_keys: dict, levels) -> list[dict]:
    """The most throttled keys of each level below the tenants' (users as team / user), each
    with links that carry its whole key: a user's buckets are its team's tier's."""
    order = sorted((level for level in top_keys if level != TENANT_LEVEL), key=lambda level: _position(levels, level))
    return [
        {
            "level": level,
            "title": _level_title(level),
            "keys": [
                {
                    **row,
                    "buckets_url": bucket_url(level, row["key"], row.get("team")),
                    "tenant_url": tenant_url(row["team"]) if row.get("team") else None,
                }
                for row in top_keys[level]
            ],
        }
        for level in order
    ]


def _level_title(level: str) -> str:
    return {"user": "Users (team / user)"}.get(level, f"Keys at level {level}")


def _position(levels, level: str) -> int:
    return levels.index(level) if level in levels else len(levels)


# --- panel 2: one key's buckets -----------------------------------------------------------


def bucket_context(query: BucketQuery, policy) -> dict:
    """What GET /api/v1/buckets says about the key, ready to show; form errors otherwise."""
    context = {"form": query}
    if not query.is_bound or not query.is_valid():
        return context
    data = query.cleaned_data
    try:
        report = bucket_report(data["level"], data["key"], data.get("team") or None)
    except APIError as error:
        query.add_api_error(error)
        return context
    except StoreUnavailable as error:
        return {**context, "query": query.query(), "unavailable": str(error)}
    tenant = policy.tenants.get(report["tenant"]) if report["tenant"] else None
    return {
        **context,
        "query": query.query(),
        "report": report,
        "rules": [_rule_row(rule) for rule in report["rules"]],
        "tenant_url": _change_url("tenant", _pk(Tenant, key=report["tenant"])),
        "tier_url": _change_url("tier", _pk(Tier, name=report["tier"])),
        "overrides_until": _local(tenant.until) if tenant and tenant.until and report["override"] else None,
    }


def _rule_row(rule: dict) -> dict:
    """One rule's live state, as the operator reads it: what is left of how much."""
    state = rule["state"]
    for field, total, what in (  # noqa: B007  (`what` is read after the loop)
        ("tokens", "capacity", "tokens left"),
        ("in_flight", "limit", "in flight"),
        ("used", "limit", "used in the window"),
    ):
        if field in state:
            value, most = state[field], state.get(total)
            break
    else:
        value, most, what = state.get("remaining"), None, "remaining"
    return {
        **rule,
        "what": what,
        "value": _round(value),
        "most": most,
        "full_in": _duration(state.get("full_in"), never="never (does not refill)", zero="full now"),
        "debt": _debt(state),
    }


def shown_rules(query: BucketQuery) -> str:
    """The rules a reset of this key acts on, as a JSON list: the confirmation page carries
    them, and the reset goes ahead only if they are still the key's rules."""
    level = query.cleaned_data["level"]
    rules = policy_cache().limiter_for(query.team_key).levels.get(level, [])
    return json.dumps([f"{level}: {rule.display()}" for rule in rules if rule.stateful])


def _debt(state: dict) -> str | None:
    """For a bucket below zero (a settled charge above its estimate): when it is back above."""
    clears_in = state.get("debt_clears_in", 0.0)  # null in JSON: it never refills
    if clears_in == 0.0:
        return None
    return f"in debt: back above zero in {_duration(clears_in)}" if clears_in else "in debt for good (never refills)"


def reset_buckets(request, query: BucketQuery) -> None:
    """Forget the state of every rule of the key (it starts full), and log who did it."""
    data = query.cleaned_data
    policy_cache().limiter_for(query.team_key).reset(data["level"], data["key"])
    # The admin's own log, so the reset shows in the operator's "Recent actions", attached to
    # the tenant of the key's team when it has one (the entry links to its page).
    team = query.team_key
    tenant = Tenant.objects.filter(key=team).first() if team is not None else None
    what = key_name(data["level"], data["key"], data.get("team"))
    log_console_action(request, f"reset the buckets of {what}", what, tenant)
    messages.success(request, f"The buckets of {what} were reset: they start full.")


def key_name(level: str, key: str, team: str | None = None) -> str:
    """A key as the console names it: the team key alone, a user as `team / user`, any other
    key with its level (`global: *`)."""
    if level == TENANT_LEVEL:
        return key
    return f"{team} / {key}" if team else f"{level}: {key}"


def dry_run_context(query: DryRunQuery) -> dict:
    """The decision a request for this key would get now, and each rule's wait; takes nothing."""
    context = {"form": query}
    if not query.is_valid():
        return context
    data = query.cleaned_data
    limiter = policy_cache().limiter_for(query.team_key)
    try:
        decision, rows = limiter.explain({data["level"]: data["key"]}, data["cost"], data["priority"] or None)
    except InvalidRequest as error:
        query.add_api_error(error)
        return context
    except StoreUnavailable as error:
        return {**context, "unavailable": str(error)}
    body = decision_body(decision)
    return {
        **context,
        "decision": {**body, "remaining": _round(body["remaining"])},
        "retry_after": _duration(body["retry_after"], never="never: the cost exceeds a limit", zero="now"),
        "rules": [
            {
                **row,
                "remaining": _round(row["remaining"]),
                "wait_text": _duration(row["wait"], never="never", zero="none"),
            }
            for row in explain_rows(rows)
        ],
    }


def bucket_url(level: str, key: str, team: str | None = None) -> str:
    """The dashboard's bucket panel for a key; a user key with the team whose tier applies."""
    query = {"level": level, "key": key, **({"team": team} if team and level != TENANT_LEVEL else {})}
    return f"{reverse('admin:dashboard')}?{urlencode(query)}#buckets"


def tenant_url(key: str) -> str:
    return reverse("admin:dashboard-tenant", args=[key])


# --- panel 3: health ----------------------------------------------------------------------


def health_context(policy, reports: dict) -> dict:
    levels = dict(Level.objects.values_list("name", "pk"))
    priorities = dict(PriorityClass.objects.values_list("name", "pk"))
    return {
        "store": store_health(policy_cache().store),
        "version": policy.version,
        "levels": [
            {
                "name": name,
                **mode,
                "meaning": _fail_mode_meaning(mode),
                "edit_url": _change_url("level", levels.get(name)),
            }
            for name, mode in policy.fail_modes.items()
        ],
        "priorities": [
            {
                "name": name,
                "watermark": f"{spec['watermark']:g}",
                "percent": f"{spec['watermark'] * 100:g}",
                "levels": ", ".join(spec.get("levels", [])) or "global (default)",
                "edit_url": _change_url("priorityclass", priorities.get(name)),
            }
            for name, spec in sorted(policy.priorities.items())
        ],
        "rates": [_rates(WINDOWS[name][0], report) for name, report in reports.items() if name in ("5m", "1h")],
    }


def store_health(store) -> dict:
    """Up, or down and since when, for each part of the store (a cluster's primaries), as
    the store's health() reports it, after a ping (the stores' probe)."""
    try:
        store.ping()
        error = None
    except StoreUnavailable as failure:
        error = str(failure)
    parts = [
        {
            "name": part["name"],
            "up": part["state"] == "up",
            "since": _local(part["down_since"]) if part["down_since"] is not None else None,
            "for": _duration(time.time() - part["down_since"]) if part["down_since"] is not None else None,
            "failures": part["failures"],
        }
        for part in store.health()
    ]
    return {"up": error is None and all(part["up"] for part in parts), "error": error, "parts": parts}


def _fail_mode_meaning(mode: dict) -> str:
    return FAIL_MODE_MEANING.get(mode["fail_mode"], mode["fail_mode"]).format(
        fraction=mode.get("fallback_fraction") or 0
    )


def _rates(label: str, report: dict | str) -> dict:
    """Decisions and denials per second over the window, from the statistics' own counts."""
    if isinstance(report, str):
        return {"label": label, "unavailable": report}
    seconds = max(report["until"] - report["since"], 1)
    return {
        "label": label,
        "decisions": report["decisions"],
        "denied": report["denied"],
        "decision_rate": _figure(report["decisions"] / seconds),
        "denial_rate": _figure(report["denied"] / seconds),
        "share": _share(report["denied"], report["decisions"]),
    }


# --- helpers ------------------------------------------------------------------------------


def _share(part: int, whole: int) -> float:
    return part / whole * 100 if whole else 0.0


def _figure(value: float) -> str:
    """Three significant figures: 0.05, 0.0167, 123."""
    return f"{value:.3g}"


def _round(value):
    """Two decimals: the store's floating point leaves crumbs (995.000004 tokens)."""
    return round(value, 2) if isinstance(value, float) else value


def _pk(model, **lookup):
    if any(value is None for value in lookup.values()):
        return None
    return model.objects.filter(**lookup).values_list("pk", flat=True).first()


def _change_url(model_name: str, pk) -> str | None:
    return reverse(f"admin:policies_{model_name}_change", args=[pk]) if pk is not None else None


def _local(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=timezone.get_current_timezone())


def _duration(seconds: float | None, never: str = "never", zero: str = "0 s") -> str:
    """`2.5 s`, `3 min 20 s`, `1 h 5 min`; None or infinity is `never`."""
    if seconds is None or not math.isfinite(seconds):
        return never
    if seconds <= 0:
        return zero
    if seconds < 60:
        return f"{seconds:.2f} s" if seconds < 1 else f"{seconds:.1f} s".replace(".0 s", " s")
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


# --- search -------------------------------------------------------------------------------


def search_context(q: str) -> dict:
    """Tenants whose key starts with `q`, and users seen recently whose key does."""
    q = q[:MAX_KEY_LENGTH]
    if not q.strip():
        return {"q": q, "empty": True}
    tenants = list(Tenant.objects.filter(key__startswith=q).select_related("tier").order_by("key")[:SEARCH_RESULTS])
    context = {
        "q": q,
        "tenants": [{"key": t.key, "tier": t.tier.name, "url": tenant_url(t.key)} for t in tenants],
    }
    try:
        users = denial_stats().seen_users(q, SEARCH_RESULTS)
    except StoreUnavailable as error:
        return {**context, "users": [], "unavailable": str(error)}
    context["users"] = [
        {
            **user,
            "buckets_url": bucket_url("user", user["user"], user["team"]),
            "tenant_url": tenant_url(user["team"]) if user["team"] else None,
        }
        for user in users
    ]
    return context
