"""The admin's log of what operators did (Django's LogEntry), read as sentences: the index's
recent actions, and the console's own entries (a reset of buckets, a quick raise).

An entry made by an admin page holds Django's JSON change message; a change of a policy row
is worded instead from the history record its save made (`policies.changes`), so that it
reads as that row's history page does: `changed tier pro: user: token_bucket capacity 100 →
200`. The console's entries hold their sentence as plain text, as Django lets custom code
do, name the tenant they concern when there is one, and link to its tenant page.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.urls import reverse

from policies.changes import Names, previous_records, record_changes, sentence_parts
from policies.models import Tenant
from policies.signals import POLICY_MODELS

RECENT = 10  # entries on the index
VERBS = {ADDITION: "added", CHANGE: "changed", DELETION: "deleted"}
# How long after the history record of a save Django logs it (the formsets are saved between).
LOGGED_WITHIN = timedelta(minutes=1)


def log_console_action(request, sentence: str, name: str, tenant: Tenant | None = None) -> None:
    """Log what the console did: `sentence` (`reset the buckets of acme / alice`) names the
    thing it acted on as `name` (`acme / alice`), which the recent actions link; `tenant` is
    the tenant it concerns, whose page the link opens."""
    LogEntry.objects.create(
        user=request.user,
        action_flag=CHANGE,
        content_type=ContentType.objects.get_for_model(Tenant) if tenant else None,
        object_id=str(tenant.pk) if tenant else None,
        object_repr=name[:200],
        change_message=sentence,
    )


def recent_actions(user, limit: int = RECENT) -> list[dict]:
    """The operator's last actions, newest first, each as a sentence in three parts (before,
    the name it links, after), with the link and when it was done."""
    entries = list(LogEntry.objects.filter(user=user).select_related("content_type")[:limit])
    records = _history_records(entries)
    names = Names()
    previous: dict = {}
    for model in {type(r) for r in records.values()}:
        previous |= {
            (model, pk): r for pk, r in previous_records(r for r in records.values() if type(r) is model).items()
        }
    actions = []
    for entry in entries:
        record = records.get(entry.pk)
        if record is not None:
            changes = record_changes(record, previous.get((type(record), record.history_id)), names)
            parts = sentence_parts(record, changes, names)
        else:
            parts = _entry_parts(entry)
        before, name, after = parts
        actions.append(
            {
                "before": before[:1].upper() + before[1:],
                "name": name,
                "after": after,
                "url": _url(entry),
                "when": entry.action_time,
                "flag": {ADDITION: "addlink", CHANGE: "changelink", DELETION: "deletelink"}.get(entry.action_flag, ""),
            }
        )
    return actions


def _is_console(entry: LogEntry) -> bool:
    # Django's own entries hold a JSON list, or nothing (deletions); the console's a sentence.
    return bool(entry.change_message) and not entry.change_message.startswith("[")


def _history_records(entries: list[LogEntry]) -> dict[int, Any]:
    """The history record each admin save of a policy row made, by entry: the row's latest
    record by the same operator at most LOGGED_WITHIN before the entry."""
    models = {ContentType.objects.get_for_model(model).pk: model for model in POLICY_MODELS}
    found = {}
    for entry in entries:
        model = models.get(entry.content_type_id or 0)
        if model is None or entry.action_flag == DELETION or _is_console(entry):
            continue
        record = (
            model.history.filter(
                id=entry.object_id,
                history_user_id=entry.user_id,
                history_date__lte=entry.action_time,
                history_date__gte=entry.action_time - LOGGED_WITHIN,
            )
            .order_by("-history_date", "-history_id")
            .first()
        )
        if record is not None:
            found[entry.pk] = record
    return found


def _entry_parts(entry: LogEntry) -> tuple[str, str, str]:
    """An entry with no history record to word it: the console's sentence as it is, split
    around the name it links; else Django's own message."""
    if _is_console(entry):
        before, found, after = entry.change_message.partition(entry.object_repr)
        return (before, found, after) if found else (entry.change_message, "", "")
    kind = entry.content_type.name if entry.content_type else "object"
    message = entry.get_change_message() if entry.action_flag == CHANGE else ""
    detail = f": {message[:1].lower()}{message[1:].rstrip('.')}" if message else ""
    return f"{VERBS.get(entry.action_flag, 'changed')} {kind} ", entry.object_repr, detail


def _url(entry: LogEntry) -> str | None:
    if _is_console(entry):
        if entry.content_type is not None and entry.content_type.model_class() is Tenant and entry.object_id:
            key = Tenant.objects.filter(pk=entry.object_id).values_list("key", flat=True).first()
            return reverse("admin:dashboard-tenant", args=[key]) if key else None
        return None
    return None if entry.action_flag == DELETION else entry.get_admin_url() or None
