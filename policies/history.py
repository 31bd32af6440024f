"""The rules in a tier's or tenant's history, and reverting to a version of a policy row.

Rules are rows of their own, so a tier's history record (django-simple-history) would hold
its name alone. Each record of a tier or tenant also keeps the rules it had then (`rules`,
from `RulesAtVersion`): taken when the record is made, and taken again once the write that
made it has replaced the rules. Every write saves the owner first and its rules after, in
one transaction (the admin's pages, the API, the loader, a revert, a quick raise), so the
record made by a write holds the rules that write left; a rule saved on its own page saves
its owner after it, which makes a new record. `policies.changes` diffs consecutive records.

Reverting to a version puts the row's fields back through its admin form (as any edit,
checked and optimistically locked), and for a tier or tenant its rules too, once they have
been checked against the policy as it is now (`policies.invariants`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .integrity import check_owner
from .invariants import PolicyViolation
from .models import Level, Rule, Tenant, Tier, rule_specs

RULE_FIELDS = ("position", "type", "params", "label", "shadow", "counts")


def rule_rows(owner: Tier | Tenant) -> list[dict[str, Any]]:
    """The owner's rules as its history keeps them: each row's level (by id, so that a
    renamed level is still found) and fields, in order."""
    return [
        {"level": rule.level_id, **{name: getattr(rule, name) for name in RULE_FIELDS}}
        for rule in Rule.objects.filter(**owned_by(owner)).order_by("level__position", "position", "id")
    ]


def owned_by(owner: Tier | Tenant) -> dict[str, Any]:
    return {"tier": owner, "tenant": None} if isinstance(owner, Tier) else {"tier": None, "tenant": owner}


def keep_rules(sender, instance, history_instance, **kwargs) -> None:
    """pre_create_historical_record: a tier's or tenant's new record holds its rules now."""
    if isinstance(instance, (Tier, Tenant)) and instance.pk is not None:
        history_instance.rules = rule_rows(instance)


def record_rules(owner: Tier | Tenant) -> None:
    """After a write replaced the owner's rules: its latest record, made by that write when
    it saved the owner, holds the rules it left."""
    latest = owner.history.order_by("-history_date", "-history_id").first()
    if latest is not None:
        type(latest).objects.filter(pk=latest.pk).update(rules=rule_rows(owner))


# Reverting ---------------------------------------------------------------------------------------


def revert_refusal(record) -> str | None:
    """Why the row cannot be reverted to `record`, a history record of it; None if it can."""
    model = record.instance_type
    kind = model._meta.verbose_name
    if not model.objects.filter(pk=getattr(record, model._meta.pk.attname)).exists():
        return f"This {kind} was deleted: reverting cannot bring it back. Make a new one; this page shows what it was."
    if model not in (Tier, Tenant):
        return None
    if record.rules is None:
        return (
            f"This version of the {kind} was recorded without its rules (before each version kept them), so "
            f"reverting to it could not put its rules back. Edit the {kind} instead."
        )
    try:
        check_owner(kind, rules_by_level(record))
    except PolicyViolation as error:
        return f"Its rules at this version would break the policy as it is now: {error}"
    return None


def rules_by_level(record) -> dict[str, list[dict]]:
    """A tier's or tenant's rules at `record`, as specs by the names their levels have now.
    Raises PolicyViolation for a level deleted since."""
    levels = {level.pk: level.name for level in Level.objects.all()}
    out: dict[str, list[dict]] = {}
    for row in record.rules or []:
        if row["level"] not in levels:
            raise PolicyViolation(f"a rule at level #{row['level']}, which no longer exists")
        fields = {name: row[name] for name in RULE_FIELDS if name != "position"}
        out.setdefault(levels[row["level"]], []).append(Rule(**fields).spec())
    return out


def put_back_rules(owner: Tier | Tenant, record) -> None:
    """Make the owner's rules those of `record` (checked by revert_refusal), row for row, in
    the transaction that saved the owner."""
    Rule.objects.filter(**owned_by(owner)).delete()
    levels = Level.objects.in_bulk([row["level"] for row in record.rules])
    for row in record.rules:
        Rule(level=levels[row["level"]], **owned_by(owner), **{name: row[name] for name in RULE_FIELDS}).save()
    record_rules(owner)


def replace_rules(
    owner: Tier | Tenant | None, rules: Mapping[str, list[Any]], levels: Mapping[str, Level] | None = None
) -> bool:
    """Make the rules of `owner` (None: the global rules) these specs by level name, replacing
    them all. Left alone when nothing changes, so that the audit trail shows real changes
    only; True when they changed. The caller has checked them (`policies.invariants`), and
    saved the owner first in the same transaction: its history record made by that save
    then holds these rules."""
    held = {"tier": owner if isinstance(owner, Tier) else None, "tenant": owner if isinstance(owner, Tenant) else None}
    current = Rule.objects.filter(**held).select_related("level")
    wanted = {level: [Rule.from_spec(spec).spec() for spec in specs] for level, specs in rules.items() if specs}
    if rule_specs(current) == wanted:
        return False
    levels = levels if levels is not None else {level.name: level for level in Level.objects.all()}
    current.delete()
    for level, specs in wanted.items():
        for position, spec in enumerate(specs):
            Rule.from_spec(spec, level=levels[level], position=position, **held).save()
    if owner is not None:
        record_rules(owner)
    return True
