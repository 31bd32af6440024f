"""The console's pages: the dashboard at /admin/dashboard/ (who is throttled by what, a
key's live buckets, a dry run, a reset, the limiter's health, search) and the tenant page at
/admin/dashboard/tenants/<key>/ (one tenant's rules, buckets and traffic, and a quick raise).

The panels are partials that htmx polls and swaps in place; the page itself renders them
all, so it also works without JavaScript. The views are wired up by
`LimiterAdminSite.get_urls()`, each behind `admin_view` (staff only). What they show is
built by `panels`, `buckets` and `tenant`; the changes go through policies.services.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.decorators import method_decorator
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from core import StoreUnavailable
from limiter_admin.actions import log_console_action
from policies.compile import policy_cache
from policies.models import StaleVersion, Tenant
from policies.overrides import MAX_HOURS, QuickRaiseRefused
from policies.services.errors import ServiceError
from policies.services.quotas import top_up
from policies.services.tenant_limits import raise_limit

from .buckets import bucket_context, dry_run_context, reset_buckets, shown_rules
from .formatting import local_time, tenant_url
from .forms import BucketQuery, CreditsForm, DryRunQuery, RaiseForm
from .panels import WINDOWS, denial_reports, health_context, search_context, throttled_context, window_name
from .tenant import tenant_context

PARTIALS = "admin/dashboard/"
# How often each panel refreshes itself (seconds).
REFRESH = {"throttled": 10, "buckets": 3, "health": 5}
# The quick raise's choices on the tenant page.
FACTORS = (1.5, 2, 5, 10)
DEFAULT_HOURS = 4
STALE = (
    "This tenant or its rules changed since you opened the page (someone else saved it, or a "
    "policy file was loaded). Nothing was raised: look at the rules below and try again."
)

# Django's own method checks (a 405 naming the allowed methods), for methods of a class.
only_safe = method_decorator(require_safe)
only_post = method_decorator(require_POST)
safe_or_post = method_decorator(require_http_methods(["GET", "HEAD", "POST"]))


class DashboardViews:
    """The dashboard's pages and partials, for one admin site."""

    def __init__(self, site) -> None:
        self.site = site

    @only_safe
    def page(self, request):
        policy = policy_cache().current()
        window = window_name(request.GET.get("window"))
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

    @only_safe
    def throttled(self, request):
        window = window_name(request.GET.get("window"))
        context = throttled_context(denial_reports(WINDOWS), window, policy_cache().current())
        return TemplateResponse(request, PARTIALS + "_throttled.html", {"throttled": context, "refresh": REFRESH})

    @only_safe
    def buckets(self, request):
        policy = policy_cache().current()
        context = bucket_context(BucketQuery(request.GET, policy), policy)
        return TemplateResponse(request, PARTIALS + "_buckets.html", {"buckets": context, "refresh": REFRESH})

    @only_safe
    def dry_run(self, request):
        context = dry_run_context(DryRunQuery(request.GET, policy_cache().current()))
        return TemplateResponse(request, PARTIALS + "_dry_run.html", {"dry_run": context})

    @only_safe
    def health(self, request):
        reports = denial_reports({"5m": WINDOWS["5m"], "1h": WINDOWS["1h"]})
        context = health_context(policy_cache().current(), reports)
        return TemplateResponse(request, PARTIALS + "_health.html", {"health": context, "refresh": REFRESH})

    @safe_or_post
    def reset(self, request):
        """GET: what would be reset, and a form to confirm. POST (with the CSRF token, as
        admin_view requires): reset, record it in the admin log, back to the dashboard."""
        policy = policy_cache().current()
        query = BucketQuery(request.POST if request.method == "POST" else request.GET, policy)
        if request.method == "POST" and query.is_valid():
            done = self._reset(request, query)
            if done:
                return done
        context = {
            **self.site.each_context(request),
            "title": "Reset buckets?",
            "buckets": bucket_context(query, policy),
            "shown": shown_rules(query) if query.is_valid() else "",
            "refresh": REFRESH,
        }
        return TemplateResponse(request, PARTIALS + "reset_confirm.html", context)

    @staticmethod
    def _reset(request, query: BucketQuery) -> HttpResponseRedirect | None:
        """Reset the key's buckets if its rules are still those the operator confirmed: back to
        the dashboard. None, with a message saying why, when nothing was reset."""
        shown = request.POST.get("shown")
        if shown is not None and shown != shown_rules(query):
            messages.error(
                request,
                "Nothing was reset: the rules of this key changed since the page was shown. "
                "Check the buckets below and confirm again.",
            )
            return None
        try:
            what = reset_buckets(request, query)
        except StoreUnavailable as error:
            messages.error(request, f"Nothing was reset: the store is unreachable ({error}).")
            return None
        messages.success(request, f"The buckets of {what} were reset: they start full.")
        return HttpResponseRedirect(f"{reverse('admin:dashboard')}?{query.query()}#buckets")

    @only_safe
    def search(self, request):
        """Suggestions as the operator types: tenants by key prefix (from the database) and
        users seen recently (from the statistics). A partial for htmx, else a page, or the
        tenant's page when the key submitted is a tenant's."""
        q = request.GET.get("q", "")
        context: dict[str, Any] = {"search": search_context(q)}
        if request.headers.get("HX-Request"):
            return TemplateResponse(request, PARTIALS + "_search.html", context)
        if any(tenant["key"] == q for tenant in context["search"].get("tenants", [])):
            return HttpResponseRedirect(tenant_url(q))  # an exact key, submitted: its page
        context.update(self.site.each_context(request), title="Find a tenant or user")
        return TemplateResponse(request, PARTIALS + "search.html", context)


class TenantViews:
    """The tenant page and its quick raise, for one admin site."""

    def __init__(self, site) -> None:
        self.site = site

    @only_safe
    def page(self, request, key):
        context = {
            **self.site.each_context(request),
            **tenant_context(key, request.GET.get("recent")),
            "title": f"Tenant {key}",
            "refresh": REFRESH,
            "factors": FACTORS,
            "default_hours": DEFAULT_HOURS,
            "max_hours": MAX_HOURS,
        }
        return TemplateResponse(request, PARTIALS + "tenant.html", context)

    @only_post
    def credits(self, request):
        """POST (with the CSRF token): top up a tenant's credits, log it, back to the page."""
        form = CreditsForm(request.POST)
        key = request.POST.get("key")
        if not form.is_valid():
            problems = "; ".join(f"{name}: {' '.join(map(str, errors))}" for name, errors in form.errors.items())
            messages.error(request, f"No credits were added: {problems}.")
            return HttpResponseRedirect(tenant_url(key) if key else reverse("admin:dashboard"))
        data = form.cleaned_data
        try:
            added = top_up(
                data["key"],
                data["level"],
                data["position"],
                data["add"],
                by=request.user.get_username(),
                user=request.user,
            )
        except ServiceError as error:
            messages.error(request, f"No credits were added: {error}.")
        except StoreUnavailable as error:
            messages.error(request, f"No credits were added: the store is unreachable ({error}).")
        else:
            rule, balance = f"{data['level']}: {added['rule']}", added["balance"]
            what = f"added {data['add']:g} credits to {rule} of {data['key']} (balance {balance:g})"
            log_console_action(request, what, data["key"], Tenant.objects.filter(key=data["key"]).first())
            messages.success(
                request, f"Added {data['add']:g} credits: {data['key']}'s balance is {added['balance']:g}."
            )
        return HttpResponseRedirect(tenant_url(data["key"]) + "#tenant-quotas")

    @only_post
    def raise_limit(self, request):
        """POST (with the CSRF token, as admin_view requires): raise, log it, back to the page."""
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
            raised = raise_limit(
                data["key"], data["level"], data["rule"], data["factor"], data["hours"], data["version"]
            )
        except StaleVersion:
            messages.error(request, STALE)
        except QuickRaiseRefused as refusal:
            messages.error(request, f"Nothing was raised: {refusal}")
        else:
            _log_raise(request, raised, data)
            messages.success(
                request,
                f"Raised {raised.level}: {data['rule']} x{data['factor']:g} to {raised.rule} for {data['key']} "
                f"until {local_time(raised.until.timestamp()):%Y-%m-%d %H:%M %Z}: "
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
