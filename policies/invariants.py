"""The invariants of a policy, each stated once. The admin, the REST API and the policy file
(`loadpolicies`) all call these functions; none of them words a policy rule of its own.

A violation is a `PolicyViolation`, a core.ConfigError, so a policy file reports it as it
reports any bad field: `path` says where, relative to what was checked (`user[1]`,
`capacity`), and `reason` says why, in the same words whichever path refused it. A
`PolicyConflict` clashes with what is stored (a name taken, a rule that repeats one already
at its level, a row still in use): the API answers it with a 409, where a violation is a 400.

Inventory: every invariant, where it was checked before, and where it lives now.

1. A level's, tier's or priority class's name is letters, digits and _ . : -, to its very
   end. Was: the models' validator, a copy of it in the serializers, and the file's own
   check with its own message. Now: `NAME_VALIDATOR`, on the model fields and the API's
   fields; `check_name` for the file.
2. Names (and tenant keys) are unique. Was: the database and each model's validate_unique,
   worded by Django for the admin and anew by the API. Now: the database; `taken` words it
   (`Versioned.unique_error_message`), and the API's 409 repeats the model's message.
3. A level's fail mode is open, closed or local; its fallback fraction is above 0 and at
   most 1. Was: Level.clean and the file, each calling core.config its own way. Now:
   `check_fail_mode` (Level.clean, hence the admin and the API; the file).
4. A priority class's watermark is from 0 up to (not including) 1. Was: PriorityClass.clean
   and the file's core.config.parse_priorities. Now: `check_watermark` (the model, hence the
   admin and the API); the file's priorities go through the same core.config function.
5. A rule builds with the engine (a registered type, its declared parameters in bounds, a
   label, shadow and counts it takes) and fits the row that keeps it (a label of at most 64
   characters). Was: Rule.clean (`check_rule_spec`), the serializers (the engine, then the
   row's full_clean) and the file (the engine, then `_check_row_fields`). Now: `check_rule`.
6. A rule belongs to a tier, a tenant or neither (a global rule), never both: Rule.clean and
   a database constraint (neither the API nor a file can say both). Unchanged.
7. A tier has at least one rule. Was: the admin's inline formset, the tier serializer and
   the file, in three wordings; not checked when a tier's last rule was deleted, or moved to
   another owner, on the rule's own page. Now: `check_owner_rules`, and `check_rule_rows`
   for the rule page and its delete action.
8. No rule repeats another at its level, counting the level's global rules: the same type
   and parameters are one bucket, whatever the label. Was: the admin (`check_with_global_rules`
   in admin.py, which the API imported, and its own loop on the rule page), the API
   (its own refuse_repeats) and the file (`_check_compiles`), each with its own message. Now:
   `check_owner_rules`, `check_global_rules` and `check_rule_rows`.
9. What a policy names exists: a tenant's tier, the default tier, a priority class's levels,
   the levels rules are keyed by. The admin offers only existing rows; the API and the file
   look names up, and `unknown` words a miss for both.
10. A tier that is the default tier or has tenants, and a level that has rules or that a
    priority class applies at, are not deleted. Was: the database (PROTECT, which does not
    cover a priority class's levels) and the API's views; the admin deleted a level that
    priority classes used without a word, and those classes fell back to `global`. Now:
    `check_deletable`, called by the API, the admin (`get_deleted_objects`, which also
    serves its bulk delete action) and the loader.
11. A row changed since it was read is not saved over it (optimistic locking): one place,
    `Versioned.save`. The admin's page and the API compare the version first only to word
    the refusal for their reader. Unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator

from core import ConfigError
from core.config import DEFAULT_FALLBACK_FRACTION, FailMode, parse_fail_modes, parse_priorities
from core.rules import build_rule

if TYPE_CHECKING:
    from .models import Rule

# \A and \Z, not ^ and $: `$` also matches before a trailing newline.
NAME_VALIDATOR = RegexValidator(r"\A[A-Za-z0-9_.:-]+\Z", "Letters, digits and _ . : - only.")

RuleSpecs = Mapping[str, list[Any]]  # rule specs by level name, as the policy file spells them


class PolicyViolation(ConfigError):
    """A change that would break an invariant of the policy: `reason` says which, `path`
    where (relative to what was checked)."""

    conflict = False


class PolicyConflict(PolicyViolation):
    """A violation that clashes with what is stored: a name taken, a rule that repeats one
    already at its level, a row still in use."""

    conflict = True


def within(path: str, error: ConfigError) -> PolicyViolation:
    """`error` with its path put under `path` (`tiers.pro` and `user[1]`: `tiers.pro.user[1]`)."""
    inner = error.path.lstrip(".")
    where = f"{path}.{inner}" if path and inner else path or inner
    kind = PolicyConflict if getattr(error, "conflict", False) else PolicyViolation
    return kind(error.reason, where)


# Names ---------------------------------------------------------------------------------------


def unknown(kind: str, name: Any, known: Iterable[str]) -> str:
    """The reason for a name that names no row: `unknown tier 'gold' (known: free, pro)`."""
    return f"unknown {kind} {name!r} (known: {', '.join(known) or 'none'})"


def taken(kind: str, name: Any) -> str:
    """The reason for a name another row holds: `tier 'pro' already exists`."""
    return f"{kind} {name!r} already exists"


def check_name(value: Any) -> str:
    """A level's, tier's or priority class's name (invariant 1)."""
    try:
        NAME_VALIDATOR(value if isinstance(value, str) else "")
    except ValidationError:
        raise PolicyViolation(str(NAME_VALIDATOR.message)) from None
    return value


# Levels and priority classes -------------------------------------------------------------------


def check_fail_mode(fail_mode: Any, fallback_fraction: Any = DEFAULT_FALLBACK_FRACTION) -> FailMode:
    """What a level does while the store is down (invariant 3); the path names the field."""
    try:
        return parse_fail_modes({"_": {"fail_mode": fail_mode, "fallback_fraction": fallback_fraction}}, ("_",))["_"]
    except ConfigError as error:
        raise PolicyViolation(error.reason, error.path.rsplit(".", 1)[-1]) from None


def check_watermark(watermark: Any) -> float:
    """The share of capacity a priority class leaves (invariant 4); the path is `watermark`."""
    try:
        return parse_priorities({"_": {"watermark": watermark}}, ("global",))["_"].watermark
    except ConfigError as error:
        raise PolicyViolation(error.reason, "watermark") from None


# Rules -----------------------------------------------------------------------------------------


def check_rule(spec: Any, path: str = "") -> None:
    """One rule spec builds with the engine and fits the Rule row that keeps it (invariant 5)."""
    from .models import Rule

    try:
        build_rule(spec, "")
    except ConfigError as error:
        raise within(path, error) from None
    try:
        Rule.from_spec(spec).clean_fields(exclude=["tier", "tenant", "level", "position"])
    except ValidationError as error:
        field, messages = next(iter(error.message_dict.items()))
        raise within(path, PolicyViolation(" ".join(messages), field)) from None


def check_owner_rules(kind: str, rules: RuleSpecs, global_rules: RuleSpecs | None = None) -> None:
    """The rules of one tier or tenant (`kind`), with the global rules of each level (the
    stored ones unless given): each builds, a tier has one at least (invariant 7), and none
    repeats another at its level, its owner's or a global one (invariant 8). The path names
    the owner's rule (`user[1]`)."""
    for level, specs in rules.items():
        for i, spec in enumerate(specs):
            check_rule(spec, f"{level}[{i}]")
    if kind == "tier" and not any(rules.values()):
        raise PolicyViolation("a tier needs at least one rule")
    refuse_repeats(rules, stored_global_rules() if global_rules is None else global_rules)


def check_global_rules(global_rules: RuleSpecs) -> None:
    """The global rules among themselves: each builds, and none repeats another at its level."""
    for level, specs in global_rules.items():
        for i, spec in enumerate(specs):
            check_rule(spec, f"{level}[{i}]")
    refuse_repeats(global_rules, {})


def refuse_repeats(rules: RuleSpecs, global_rules: RuleSpecs) -> None:
    """No rule of `rules` repeats another at its level, or one of the level's global rules:
    the same type and parameters are one bucket (the engine's rule_id), whatever the label."""
    for level, specs in rules.items():
        seen = {build_rule(spec, "").rule_id: f"global rule {j}" for j, spec in enumerate(global_rules.get(level, []))}
        for i, spec in enumerate(specs):
            built = build_rule(spec, "")
            if built.rule_id in seen:
                raise PolicyConflict(
                    f"repeats {seen[built.rule_id]} ({built.display()}) of this level: the same type and "
                    f"parameters are one bucket, whatever the label",
                    f"{level}[{i}]",
                )
            seen[built.rule_id] = f"rule {i}"


def stored_global_rules() -> dict[str, list[dict]]:
    """The global rules in the store, as specs by level name."""
    from .models import Rule, rule_specs

    return rule_specs(Rule.objects.filter(tier=None, tenant=None).select_related("level"))


def check_rule_rows(save: Rule | None = None, delete: Iterable[Rule] = ()) -> None:
    """Rule rows changed one by one (the admin's rule page and its delete action): `save`
    (a new row, or a stored one changed) and `delete` leave every owner they touch, before
    and after, with its invariants (7 and 8). A change of a global rule is checked with
    every tier's and tenant's rules. The path names the owner: `tiers.pro.user[1]`."""
    from .models import Rule, rule_specs

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
    from .models import Level, Tier

    if isinstance(row, Tier):
        _check_tier_deletable(row)
    elif isinstance(row, Level):
        _check_level_deletable(row)


def _check_tier_deletable(tier: Any) -> None:
    from .models import PolicySettings

    if PolicySettings.objects.filter(pk=1, default_tier=tier).exists():
        raise PolicyConflict(f"tier {tier.name!r} is the default tier: choose another default tier first")
    keys = list(tier.tenants.order_by("key").values_list("key", flat=True)[:5])
    if keys:
        more = tier.tenants.count() - len(keys)
        shown = ", ".join(keys) + (f" and {more} more" if more > 0 else "")
        raise PolicyConflict(f"tier {tier.name!r} is used by tenants {shown}: move them to another tier first")


def _check_level_deletable(level: Any) -> None:
    from .models import Rule

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
