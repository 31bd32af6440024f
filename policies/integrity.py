"""The invariants that read the stored rows: a change checked against every owner's rules, and
a row that something still relies on. They call the pure invariants (policies.invariants),
which word every violation; the admin, the REST API and the policy file call these.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .invariants import (
    PolicyConflict,
    PolicyViolation,
    RuleSpecs,
    check_demotions,
    check_global_rules,
    check_owner_rules,
    refuse_repeats,
    within,
)
from .models import Level, PolicySettings, PriorityClass, Rule, Tier, rule_specs


def check_owner(kind: str, rules: RuleSpecs) -> None:
    """`check_owner_rules` against the global rules in the store, and its quotas' demote_to
    against the stored priority classes."""
    check_owner_rules(kind, rules, stored_global_rules())
    check_demotions(rules, PriorityClass.objects.values_list("name", flat=True))


def stored_global_rules() -> dict[str, list[dict]]:
    """The global rules in the store, as specs by level name."""
    return rule_specs(Rule.objects.filter(tier=None, tenant=None).select_related("level"))


def check_rule_rows(save: Rule | None = None, delete: Iterable[Rule] = ()) -> None:
    """Rule rows changed one by one (the admin's rule page and its delete action): `save`
    (a new row, or a stored one changed) and `delete` leave every owner they touch, before
    and after, with its invariants (7 and 8). A change of a global rule is checked with
    every tier's and tenant's rules. The path names the owner: `tiers.pro.user[1]`."""
    delete = list(delete)
    gone = {rule.pk for rule in delete}
    changed = [*delete]
    if save is not None and save.pk is not None:
        gone.add(save.pk)
        changed += Rule.objects.filter(pk=save.pk)  # where it was before the change
    rows = [rule for rule in Rule.objects.select_related("level", "tier", "tenant") if rule.pk not in gone]
    if save is not None:
        rows.append(save)
        changed.append(save)
    rows.sort(key=lambda rule: (rule.level.position, rule.level.name, rule.position, rule.pk or 0))
    owners: dict[tuple[str, Any], list[Rule]] = {}
    for rule in rows:
        owners.setdefault(_owner_of(rule), []).append(rule)
    touched = {_owner_of(rule) for rule in changed}
    globals_ = rule_specs(owners.pop(("global", None), []))
    if ("global", None) in touched:
        try:
            check_global_rules(globals_)
        except PolicyViolation as error:
            raise within("global", error) from None
    for owner in touched | (set(owners) if ("global", None) in touched else set()):
        if owner[0] == "global":
            continue
        specs = rule_specs(owners.get(owner, []))
        try:
            if owner in touched:
                check_owner_rules(owner[0], specs, globals_)
            else:
                refuse_repeats(specs, globals_)
        except PolicyViolation as error:
            raise within(f"{owner[0]}s.{owner[1]}", error) from None


def _owner_of(rule: Rule) -> tuple[str, Any]:
    if rule.tier is not None:
        return ("tier", rule.tier.name)
    if rule.tenant is not None:
        return ("tenant", rule.tenant.key)
    return ("global", None)


# Deleting ----------------------------------------------------------------------------------------


def check_deletable(row: Any) -> None:
    """A row goes only when nothing relies on it (invariant 10): a tier that is the default
    tier or has tenants, a level that has rules or that a priority class applies at, stay.
    Raises PolicyConflict; other rows may always go."""
    if isinstance(row, Tier):
        _check_tier_deletable(row)
    elif isinstance(row, Level):
        _check_level_deletable(row)
    elif isinstance(row, PriorityClass):
        _check_priority_deletable(row)


def _check_priority_deletable(priority: Any) -> None:
    owners = sorted(
        {
            f"tier {r.tier}" if r.tier else f"tenant {r.tenant}" if r.tenant else "global"
            for r in Rule.objects.filter(type="quota").select_related("tier", "tenant")
            if (r.params or {}).get("demote_to") == priority.name
        }
    )
    if owners:
        raise PolicyConflict(
            f"priority class {priority.name!r} is what quotas of {', '.join(owners)} demote to: change them first"
        )


def _check_tier_deletable(tier: Any) -> None:
    if PolicySettings.objects.filter(pk=1, default_tier=tier).exists():
        raise PolicyConflict(f"tier {tier.name!r} is the default tier: choose another default tier first")
    keys = list(tier.tenants.order_by("key").values_list("key", flat=True)[:5])
    if keys:
        more = tier.tenants.count() - len(keys)
        shown = ", ".join(keys) + (f" and {more} more" if more > 0 else "")
        raise PolicyConflict(f"tier {tier.name!r} is used by tenants {shown}: move them to another tier first")


def _check_level_deletable(level: Any) -> None:
    rules = list(Rule.objects.filter(level=level).select_related("tier", "tenant"))
    if rules:
        owners = sorted({f"tier {r.tier}" if r.tier else f"tenant {r.tenant}" if r.tenant else "global" for r in rules})
        raise PolicyConflict(f"level {level.name!r} has {len(rules)} rule(s) ({', '.join(owners)}): remove them first")
    classes = list(level.priority_classes.order_by("name").values_list("name", flat=True))
    if classes:
        # Dropping it would quietly move those classes to their default level.
        raise PolicyConflict(
            f"level {level.name!r} is used by priority classes {', '.join(classes)}: take it out of their levels first"
        )
