"""What a change of the policy did, in the operators' words: field diffs between two history
records of a row, and one-line sentences of them.

A tier's or tenant's history record holds the rules it had at that version
(`policies.history`), so the change a record made is its own fields' diff against the
record before it, plus its rules' diff: rules added, removed, or changed field by field
(`user: token_bucket capacity 100 → 200`). The history pages, the policy versions list,
the admin's recent actions and the tenant page all word changes here.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import models
from django.utils import timezone

from core import ConfigError
from core.rules import build_rule

from .models import Alert, Level, PolicySettings, PriorityClass, Rule, Tenant, Tier

ARROW = "→"
MOST_SHOWN = 3  # changes of one record a sentence spells out; the rest are counted
RULE_FIELDS = ("label", "shadow", "counts")  # a rule's fields besides its type and parameters
VERBS = {"+": "created", "~": "changed", "-": "deleted"}
# The change reason of the record a revert makes starts so (`revert_reason`): the history pages,
# the recent actions and the policy versions say "reverted" for it, not "changed".
REVERT_PREFIX = "Revert to its version of "


@dataclass(frozen=True)
class Change:
    """One change a history record made: a field's value `old` → `new`, or a rule `added` or
    `removed` (then `new` or `old` is the rule). `what` names the field or the level."""

    what: str
    old: str = ""
    new: str = ""
    kind: str = "changed"  # changed, added, removed, note

    def __str__(self) -> str:
        if self.kind == "added":
            return f"{self.what}: added {self.new}"
        if self.kind == "removed":
            return f"{self.what}: removed {self.old}"
        if self.kind == "note":
            return f"{self.what}: {self.new}"
        return f"{self.what} {self.old} {ARROW} {self.new}"


# --- values -------------------------------------------------------------------------------


def shown(value: Any) -> str:
    """A field's value as a sentence shows it: 100 not 100.0, 'none' for nothing."""
    if value is None or value == "":
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    if isinstance(value, dt.datetime):
        return f"{timezone.localtime(value):%Y-%m-%d %H:%M %Z}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def rule_name(row: Mapping[str, Any]) -> str:
    """A rule as blocked_by names it (`token_bucket(100, 10/s)`), with its label and whether it
    is a shadow rule; from a rule row's fields (type, params, label, shadow, counts)."""
    spec = Rule(**{name: row.get(name) for name in ("type", "params", "label", "shadow", "counts")}).spec()
    try:
        name = build_rule(spec, "").display()
    except ConfigError:  # a plug-in no longer registered, or a row kept from before a check
        params = ", ".join(f"{k}={shown(v)}" for k, v in (row.get("params") or {}).items())
        name = f"{row.get('type')}({params})"
    if row.get("label"):
        name += f" [{row['label']}]"
    return name + (" (shadow)" if row.get("shadow") else "")


# --- rules ----------------------------------------------------------------------------------


def rule_changes(
    old: Sequence[Mapping] | None, new: Sequence[Mapping] | None, levels: Mapping[int, str]
) -> list[Change]:
    """What changed between two lists of rule rows (as a history record keeps them), level by
    level: a rule kept as it was is no change; one of the same type on both sides is changed
    field by field; the others were added or removed. `levels` names levels by id."""
    if old is None or new is None:
        if new and old is None:
            return [
                Change(
                    "rules", new="not kept with the version before (made before versions kept their rules)", kind="note"
                )
            ]
        return []
    changes: list[Change] = []
    order = {level: position for position, level in enumerate(levels)}
    for level in sorted({row["level"] for row in [*old, *new]}, key=lambda pk: (order.get(pk, len(order)), pk)):
        name = levels.get(level, f"level #{level} (deleted)")
        changes += _level_changes(
            name, [r for r in old if r["level"] == level], [r for r in new if r["level"] == level]
        )
    return changes


def _level_changes(level: str, old: list[Mapping], new: list[Mapping]) -> list[Change]:
    def same(row):
        return (row["type"], json.dumps(row.get("params") or {}, sort_keys=True), *(row.get(f) for f in RULE_FIELDS))

    left, right = list(old), list(new)
    for row in list(right):
        match = next((o for o in left if same(o) == same(row)), None)
        if match is not None:
            left.remove(match)
            right.remove(row)
    changes: list[Change] = []
    ambiguous = {t for t in {r["type"] for r in [*old, *new]} if max(_count(old, t), _count(new, t)) > 1}
    for row in list(right):
        match = next((o for o in left if o["type"] == row["type"]), None)
        if match is not None:
            left.remove(match)
            right.remove(row)
            what = f"{level}: {row['type']}"
            if row["type"] in ambiguous:  # another rule of its type at its level: say which
                what += f" [{match['label']}]" if match.get("label") else f" {rule_name(match)}"
            changes += _rule_field_changes(what, match, row)
    changes += [Change(level, old=rule_name(row), kind="removed") for row in left]
    changes += [Change(level, new=rule_name(row), kind="added") for row in right]
    if not changes and [same(r) for r in old] != [same(r) for r in new]:
        changes.append(Change(f"{level}: order", ", ".join(map(rule_name, old)), ", ".join(map(rule_name, new))))
    return changes


def _count(rows: list[Mapping], rule_type: str) -> int:
    return sum(1 for row in rows if row["type"] == rule_type)


def _rule_field_changes(what: str, old: Mapping, new: Mapping) -> list[Change]:
    """A rule changed in place: each parameter and field that moved, named after `what`."""
    prefix = f"{what} " if what else ""
    before, after = old.get("params") or {}, new.get("params") or {}
    changes = [
        Change(f"{prefix}{param}", shown(before.get(param)), shown(after.get(param)))
        for param in [*before, *(p for p in after if p not in before)]
        if before.get(param) != after.get(param)
    ]
    changes += [
        Change(f"{prefix}{field}", shown(old.get(field)), shown(new.get(field)))
        for field in RULE_FIELDS
        if (old.get(field) or "") != (new.get(field) or "")
    ]
    return changes


# --- records --------------------------------------------------------------------------------


class Names:
    """Names of levels, tiers and tenants by id, read once per page."""

    def __init__(self) -> None:
        self._cache: dict[type[models.Model], dict[Any, str]] = {}

    def levels(self) -> dict[int, str]:
        return self._all(Level)

    def of(self, model: type[models.Model], pk: Any) -> str:
        if pk is None:
            return "none"
        names = self._all(model) if model in (Level, Tier) else self._cache.setdefault(model, {})
        if pk not in names:
            row = model._default_manager.filter(pk=pk).first()
            names[pk] = str(row) if row is not None else f"#{pk} (deleted)"
        return names[pk]

    def _all(self, model: type[models.Model]) -> dict[Any, str]:
        if model not in self._cache:
            # Levels in evaluation order: a record's rules are listed level by level.
            self._cache[model] = {row.pk: str(row) for row in model._default_manager.all()}
        return self._cache[model]


def record_changes(record, previous, names: Names | None = None) -> list[Change]:
    """What the history record `record` changed since `previous`, the record of the same row
    before it (None for the first). A creation lists a tier's or tenant's rules as added."""
    names = names or Names()
    rules_kept = hasattr(record, "rules")
    if record.history_type == "-":
        return []
    if previous is None:
        return rule_changes([], record.rules, names.levels()) if rules_kept and record.rules else []
    if record.instance_type is Rule:
        # A rule's parameters one by one, as in a tier's diff; its other fields as they are.
        delta = record.diff_against(previous, excluded_fields=["params", *RULE_FIELDS])
        changes = [_field_change(record, change, names) for change in delta.changes]
        return changes + _rule_field_changes("", vars(previous), vars(record))
    changes = [_field_change(record, change, names) for change in record.diff_against(previous).changes]
    if rules_kept:
        changes += rule_changes(previous.rules, record.rules, names.levels())
    return changes


def _field_change(record, change, names: Names) -> Change:
    field = record.instance_type._meta.get_field(change.field)
    label = str(field.verbose_name)
    if field.many_to_many:  # the rows of its through table: {"priorityclass": 1, "level": 3}
        own = record.instance_type._meta.model_name

        def listed(rows) -> str:
            related = [names.of(field.related_model, value) for row in rows for key, value in row.items() if key != own]
            return ", ".join(related) or "none"

        return Change(label, listed(change.old), listed(change.new))
    if field.is_relation:
        return Change(label, names.of(field.related_model, change.old), names.of(field.related_model, change.new))
    return Change(label, shown(change.old), shown(change.new))


def previous_records(records: Iterable) -> dict[int, Any]:
    """The record before each of `records` (history records of one model), by history_id:
    two queries, however many records."""
    records = list(records)
    if not records:
        return {}
    history = type(records[0])
    pk = records[0].instance_type._meta.pk.attname
    ids = {getattr(record, pk) for record in records}
    # Every record of those rows, as (row, date, id) only; the ones needed are then read whole.
    skeleton = sorted(history.objects.filter(**{f"{pk}__in": ids}).values_list(pk, "history_date", "history_id"))
    before = {}
    for (row, _, record_id), (previous_row, _, previous_id) in zip(skeleton[1:], skeleton):
        if row == previous_row:
            before[record_id] = previous_id
    wanted = {record.history_id: before[record.history_id] for record in records if record.history_id in before}
    found = history.objects.in_bulk(set(wanted.values()))
    return {record_id: found[previous_id] for record_id, previous_id in wanted.items()}


# --- sentences ------------------------------------------------------------------------------


def kind_of(record) -> str:
    """A record's row kind as a sentence names it: tier, tenant, global rule, ..."""
    model = record.instance_type
    if model is Rule and record.tier_id is None and record.tenant_id is None:
        return "global rule"
    return str(model._meta.verbose_name)


def name_of(record, names: Names) -> str:
    """A record's row as a sentence names it; a rule by its level, itself and its owner."""
    if record.instance_type is not Rule:
        return str(record.history_object)
    name = f"{names.of(Level, record.level_id)}: {rule_name(vars(record))}"
    if record.tier_id:
        return f"{name} of tier {names.of(Tier, record.tier_id)}"
    if record.tenant_id:
        return f"{name} of tenant {names.of(Tenant, record.tenant_id)}"
    return name


def _shown_name(record, kind: str, names: Names) -> str:
    name = name_of(record, names)
    return "" if name == kind else name  # the policy settings: one row, named by its kind


def revert_reason(record) -> str:
    """The change reason of a revert to `record`: when that version was made, in UTC, and the
    policy version it made (when it was logged)."""
    when = f"{record.history_date.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC"
    version = f" (policy version {record.policy_version})" if record.policy_version else ""
    return f"{REVERT_PREFIX}{when}{version}"


def is_revert(record) -> bool:
    return (record.history_change_reason or "").startswith(REVERT_PREFIX)


def action_of(record) -> str:
    """What a record did, as its history page's Comment says: Created, Changed, Reverted, Deleted."""
    return "Reverted" if is_revert(record) else VERBS[record.history_type].capitalize()


def sentence(record, changes: Sequence[Change], names: Names, most: int = MOST_SHOWN) -> str:
    """`changed tier pro: user: token_bucket capacity 100 → 200` (at most `most` changes spelled
    out, the others counted)."""
    return "".join(sentence_parts(record, changes, names, most))


def sentence_parts(record, changes: Sequence[Change], names: Names, most: int = MOST_SHOWN) -> tuple[str, str, str]:
    """A record's sentence in three parts, so that a page can link the row's name: what was
    done to what kind of row (`changed tier `), the row's name, and the changes (`: ...`)."""
    kind = kind_of(record)
    name = _shown_name(record, kind, names)
    reverted = is_revert(record)
    if record.history_type == "~" and not changes and not reverted:
        return f"saved {kind} ", name, " (no change)"
    detail = f" to its version of {record.history_change_reason.removeprefix(REVERT_PREFIX)}" if reverted else ""
    if changes and record.history_type != "-":
        more = len(changes) - most
        detail += ": " + "; ".join(str(change) for change in changes[:most])
        detail += f"; and {more} more change{'s' * (more > 1)}" if more > 0 else ""
    return f"{action_of(record).lower()} {kind}{' ' if name else ''}", name, detail


# --- policy versions ------------------------------------------------------------------------

MOST_RECORDS = 3  # rows a version's summary words one by one; more are counted by kind


def version_records(versions: Iterable[int]) -> dict[int, list]:
    """The history records each policy version made, by version: a tier's or tenant's rules
    are in its own record, so their rows' records are left out where the owner has one."""
    versions = set(versions)
    out: dict[int, list] = {version: [] for version in versions}
    if not versions:
        return out
    for model in (Level, Tier, Tenant, Rule, PriorityClass, PolicySettings, Alert):
        for record in model.history.filter(policy_version__in=versions).order_by("history_date", "history_id"):
            out[record.policy_version].append(record)
    for version, records in out.items():
        owners = {(r.instance_type, r.id) for r in records if r.instance_type in (Tier, Tenant)}
        out[version] = _one_per_created_row(
            [r for r in records if r.instance_type is not Rule or not _folded(r, owners)]
        )
    return out


def _one_per_created_row(records: list) -> list:
    """A row the version created (or deleted) is said once: `created`, not also `changed` by
    the later saves of the same write (a load sets the default tier after making the settings)."""
    ends = {(r.instance_type, r.id): r for r in records if r.history_type in "+-"}
    return [r for r in records if ends.get((r.instance_type, r.id), r) is r]


def _folded(rule, owners: set) -> bool:
    return (Tier, rule.tier_id) in owners or (Tenant, rule.tenant_id) in owners


def described(records: Sequence, names: Names | None = None) -> list[tuple[Any, list[Change]]]:
    """Each record with what it changed (its predecessors read in two queries per model)."""
    names = names or Names()
    by_model: dict[type, list] = {}
    for record in records:
        by_model.setdefault(type(record), []).append(record)
    previous: dict[tuple[type, int], Any] = {}
    for model, same in by_model.items():
        previous |= {(model, pk): record for pk, record in previous_records(same).items()}
    return [(r, record_changes(r, previous.get((type(r), r.history_id)), names)) for r in records]


def summary(records: Sequence, names: Names | None = None, most: int = MOST_RECORDS) -> list[str]:
    """A version's records in a few sentences: each row's change when there are at most
    `most`, else how many rows of each kind it created, changed and deleted."""
    names = names or Names()
    if len(records) <= most:
        return [sentence(record, changes, names) for record, changes in described(records, names)]
    groups: dict[str, dict[str, list[str]]] = {}
    for record in records:
        kind = kind_of(record)
        name = _shown_name(record, kind, names) if record.instance_type is not Rule else None
        groups.setdefault(VERBS[record.history_type], {}).setdefault(kind, []).append(name or "")
    lines = []
    for verb, kinds in groups.items():
        parts = []
        for kind, rows in kinds.items():
            plural = kind if len(rows) == 1 else "priority classes" if kind == "priority class" else f"{kind}s"
            if not any(rows):  # rules, and the settings: counted, not named
                parts.append(kind if kind == "policy settings" else f"{len(rows)} {plural}")
            elif len(rows) <= most:
                parts.append(f"{plural} {', '.join(rows)}")
            else:
                parts.append(f"{len(rows)} {plural}")
        lines.append(f"{verb} {'; '.join(parts)}")
    return lines
