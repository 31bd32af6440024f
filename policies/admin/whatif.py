"""The console's "Preview impact": a tier's or tenant's change page replays recent traffic
under the form as it stands, unsaved (policies.services.whatif), and shows the table and a chart.

The page posts its whole form to `<object_id>/whatif/`. That view builds the admin's own form
and inline formsets from the post (`get_form`, `get_formsets_with_inlines`,
`get_formset_kwargs`: the admin's public hooks), so the draft is checked as a save would be,
and turns them into a partial policy document: the tier's rules at every level, or the
tenant's tier, expiry and overrides. A form that would not save answers its errors.

The replay runs on the worker's bounded pool of replays (policies.services.whatif.REPLAYS):
when it is full the page says "busy, try again" rather than starting another thread. The
page polls the same URL with `?job=<id>` and shows the progress (records replayed of both
replays) until the answer is in. A job's state is kept in the cache (Redis when REDIS_URL
is set, so any worker can answer the poll) for JOB_TTL seconds.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from functools import partial
from typing import Any

from django.contrib import admin
from django.core.cache import cache
from django.db import close_old_connections
from django.http import Http404, JsonResponse
from django.template.loader import render_to_string
from django.urls import path

from core import ConfigError, StoreUnavailable

from ..compile import policy_cache
from ..models import Level, Tenant, Tier
from ..services.errors import Busy
from ..services.whatif import draft_policies, replay_window, start_replay

WINDOWS = {"15m": 900, "1h": 3600, "6h": 21600, "24h": 86400}
DEFAULT_WINDOW = "1h"
JOB_TTL = 600
TOP = 50
_CACHE_PREFIX = "whatif-job:"

log = logging.getLogger(__name__)


class PreviewImpact(admin.ModelAdmin):
    """A ModelAdmin mixin for the tier and tenant pages: the button, its view and its job."""

    change_form_template = "admin/policies/whatif_change_form.html"

    def get_urls(self):
        opts = self.model._meta
        preview = path(
            "<path:object_id>/whatif/",
            self.admin_site.admin_view(self.whatif_view),
            name=f"{opts.app_label}_{opts.model_name}_whatif",
        )
        return [preview, *super().get_urls()]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        context = {"whatif_windows": list(WINDOWS), "whatif_window": DEFAULT_WINDOW, **(extra_context or {})}
        return super().change_view(request, object_id, form_url, context)

    def whatif_view(self, request, object_id):
        obj = self.get_object(request, object_id)
        if obj is None:
            raise Http404(f"no {self.model._meta.verbose_name} {object_id!r}")
        if request.method == "GET":
            if not self.has_view_or_change_permission(request, obj):
                raise Http404
            return _job_answer(request.GET.get("job", ""))
        if request.method != "POST" or not self.has_change_permission(request, obj):
            raise Http404
        window = request.POST.get("whatif_window", DEFAULT_WINDOW)
        if window not in WINDOWS:
            return JsonResponse({"state": "refused", "errors": [f"window must be one of {', '.join(WINDOWS)}"]})
        draft, errors = self.draft_from_post(request, obj)
        if errors:
            return JsonResponse({"state": "refused", "errors": errors})
        try:
            current, drafted = draft_policies(draft)
        except ConfigError as error:
            return JsonResponse({"state": "refused", "errors": [str(error)]})
        shielded = shielded_tenants(current, drafted, self._subject(obj)) if self.model is Tier else {}
        try:
            return JsonResponse(_start(current, drafted, WINDOWS[window], self._subject(obj), shielded))
        except Busy as busy:
            return JsonResponse({"state": "busy", "errors": [f"Busy: {busy.reason}."]})

    def draft_from_post(self, request, obj) -> tuple[dict | None, list[str]]:
        """The partial policy document the posted form would save, or the form's errors."""
        stored = self._subject(obj)  # before the form binds: it writes its values onto obj
        form = self.get_form(request, obj, change=True)(request.POST, request.FILES, instance=obj)
        formsets = [
            formset(**self.get_formset_kwargs(request, obj, inline, formset.get_default_prefix()))
            for formset, inline in self.get_formsets_with_inlines(request, obj)
        ]
        valid = form.is_valid()
        valid = all([formset.is_valid() for formset in formsets]) and valid
        if not valid:
            return None, _errors(form, formsets)
        rules: dict[str, list[dict]] = {
            level: [] for level in Level.objects.order_by("position", "name").values_list("name", flat=True)
        }
        for formset in formsets:
            rules.update(formset.rule_specs())
        return self.draft(stored, form.cleaned_data, rules), []

    @staticmethod
    def _subject(obj) -> str:
        return obj.name if isinstance(obj, Tier) else obj.key

    def draft(self, stored: str, data: dict, rules: dict[str, list[dict]]) -> dict:
        """The document for this kind of row (a rename is previewed as the row it was)."""
        if self.model is Tier:
            return {"tiers": {stored: rules}}
        assert self.model is Tenant
        until = data.get("overrides_until")
        tenant = {
            "tier": data["tier"].name,
            "overrides": rules,
            "overrides_until": until.isoformat() if until else None,
        }
        return {"tenants": {stored: tenant}}


def _errors(form, formsets) -> list[str]:
    found = [
        f"{name}: {' '.join(messages)}" if name != "__all__" else " ".join(messages)
        for name, messages in form.errors.items()
    ]
    for formset in formsets:
        found += [str(error) for error in formset.non_form_errors()]
        for i, errors in enumerate(formset.errors):
            found += [f"rule {i + 1}, {name}: {' '.join(messages)}" for name, messages in errors.items()]
    return found or ["the form has errors"]


def shielded_tenants(current, drafted, tier: str, now: float | None = None) -> dict[str, dict[str, list[str]]]:
    """The tier's tenants whose overrides (in force now) cover a level the draft changes:
    tenant -> {"overridden": levels the change does not reach, "reached": the other changed
    levels}, for the preview to say why a tenant's zero is a zero."""
    before, after = current.tiers.get(tier, {}), drafted.tiers.get(tier, {})
    changed = [level for level in current.levels if before.get(level, []) != after.get(level, [])]
    now = policy_cache().clock() if now is None else now
    shielded = {}
    for key, tenant in sorted(current.tenants.items()):
        if tenant.tier != tier or (tenant.until is not None and tenant.until <= now):
            continue
        overridden = [level for level in changed if level in tenant.overrides]
        if overridden:
            shielded[key] = {"overridden": overridden, "reached": [lv for lv in changed if lv not in overridden]}
    return shielded


def _start(current, drafted, window: int, subject: str, shielded: dict | None = None) -> dict:
    """Queue the replay on the pool (Busy when it is full); the state to answer the post with."""
    job = secrets.token_urlsafe(12)
    state = {"state": "running", "job": job, "done": 0, "total": None, "subject": subject}
    cache.set(_CACHE_PREFIX + job, state, JOB_TTL)  # before the job can write its own
    try:
        start_replay(current, drafted, window, TOP, None, runner=partial(_run, job, subject, shielded or {}))
    except Busy:
        cache.delete(_CACHE_PREFIX + job)
        raise
    return state


def _run(job: str, subject: str, shielded: dict, current, drafted, window: int, top: int, _progress) -> None:
    """The job on the pool: the replay, its progress and its answer, into the cache."""
    key = _CACHE_PREFIX + job

    def progress(done: int, total: int) -> None:
        cache.set(key, {"state": "running", "job": job, "done": done, "total": total, "subject": subject}, JOB_TTL)

    try:
        report = replay_window(current, drafted, window, top, progress)
        state: dict[str, Any] = {
            "state": "done",
            "job": job,
            "subject": subject,
            "report": report,
            "shielded": shielded,
        }
    except StoreUnavailable as error:
        state = {"state": "failed", "job": job, "errors": [f"the recorded requests cannot be read: {error}"]}
    except Exception as error:  # a bug: the page must hear of it rather than poll until the job expires
        log.exception("what-if preview %s failed", job)
        state = {"state": "failed", "job": job, "errors": [f"the replay failed: {error}"]}
    finally:
        close_old_connections()
    cache.set(key, state, JOB_TTL)


def _job_answer(job: str) -> JsonResponse:
    state = cache.get(_CACHE_PREFIX + job) if job else None
    if state is None:
        return JsonResponse({"state": "unknown", "errors": ["no such preview (it may have expired)"]}, status=404)
    if state["state"] != "done":
        return JsonResponse(state)
    report = state["report"]
    shielded = state.get("shielded") or {}
    for row in report["tenants"]:
        row["shielded"] = shielded.get(row["tenant"])
    context = {"report": report, "subject": state["subject"], "shielded": shielded}
    html = render_to_string("admin/policies/_whatif_result.html", context)
    return JsonResponse({"state": "done", "job": job, "html": html, "chart": _chart(report)})


def _chart(report: dict) -> dict:
    """Denials over time under each policy, for Chart.js."""

    def label(epoch: float) -> str:
        return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%H:%M")

    series = report["series"]
    return {
        "labels": [label(point["start"]) for point in series],
        "datasets": [
            {"label": "denied now", "data": [point["denied_now"] for point in series], "colour": "#4c78a8"},
            {
                "label": "denied under the draft",
                "data": [point["denied_draft"] for point in series],
                "colour": "#e45756",
            },
        ],
    }
