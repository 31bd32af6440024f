"""A quick raise of one limit for a few hours: an expiring tenant override, written through the
same rows and checks as any override (Tenant.overrides_until and the tenant's rules), with the
tenant's version as the optimistic lock.

    raise_limit("acme", "team", "token_bucket(1000, 100/s)", factor=2, hours=4, opened_version=3)

The override replaces the tier's rules at that level, so it copies them with the one rule
raised (its `scaled_params`, as the engine scales a rule: core.Rule.scaled). A tenant's
overrides share one expiry, so a quick raise is refused where it would change when another
override ends: overrides at another level, or one at this level that lasts longer.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from core import RULES, ConfigError
from core.rules import build_rule

from .history import record_rules
from .integrity import check_owner
from .models import Level, PolicySettings, Rule, StaleVersion, Tenant

MAX_FACTOR = 100.0
MAX_HOURS = 720  # 30 days


class QuickRaiseRefused(Exception):
    """The raise cannot be made as asked; the message says why and what to do instead."""


@dataclass(frozen=True)
class Raised:
    tenant: Tenant
    level: str
    rule: str  # the raised rule, as blocked_by names it
    until: datetime


def raisable(rule_type: str) -> bool:
    """Whether a rule type has a limit to raise (parameters that scale)."""
    cls = RULES.get(rule_type)
    return cls is not None and bool(cls.scaled_params)


def raise_limit(
    key: str, level: str, rule: str, factor: float, hours: float, opened_version: int, now: datetime | None = None
) -> Raised:
    """Raise `rule` (its display name, e.g. `token_bucket(1000, 100/s)`) at `level` for team key
    `key` by `factor` for `hours`. `opened_version` is the tenant's version when the form was
    shown (0: no tenant row yet). Raises StaleVersion if the tenant or the rule changed since,
    QuickRaiseRefused if the raise cannot be made."""
    if not 1 < factor <= MAX_FACTOR:
        raise QuickRaiseRefused(f"The factor must be more than 1 and at most {MAX_FACTOR:g}.")
    if not 0 < hours <= MAX_HOURS:
        raise QuickRaiseRefused(f"The hours must be more than 0 and at most {MAX_HOURS}.")
    now = now or timezone.now()
    until = now + timedelta(hours=hours)
    with transaction.atomic():
        tenant = Tenant.objects.select_for_update().select_related("tier").filter(key=key).first()
        if (tenant.version if tenant else 0) != opened_version:
            raise StaleVersion(f"tenant {key} changed since you opened the page")
        level_row = Level.objects.filter(name=level).first()
        if level_row is None:
            raise QuickRaiseRefused(f"There is no level {level!r}.")
        specs = _base_rules(tenant, level_row, until, now)
        index = _index_of(specs, rule, level)
        specs[index] = _raised(specs[index], factor)
        _check(level, specs)
        tenant = _save_tenant(tenant, key, until, f"{level}: {rule} x{factor:g} for {hours:g} h (dashboard)")
        Rule.objects.filter(tenant=tenant, level=level_row).delete()
        for position, spec in enumerate(specs):
            _rule_from_spec(spec, tenant=tenant, level=level_row, position=position).save()
        record_rules(tenant)  # the tenant's record this raise made holds the raised rules
    return Raised(tenant, level, build_rule(specs[index], "").display(), until)


def why_not(tenant: Tenant | None, level: str, until: datetime | None, now: datetime) -> str | None:
    """Why a quick raise at `level` lasting until `until` would change when another override
    ends, or None when it would not. `until=None`: the longest raise (MAX_HOURS) would."""
    if tenant is None:
        return None  # no tenant row: no override of its own to end sooner or later
    until = until if until is not None else now + timedelta(hours=MAX_HOURS)
    overrides = list(tenant.rules.select_related("level"))
    others = sorted({r.level.name for r in overrides if r.level.name != level})
    if others:
        return (
            f"{tenant.key} has overrides at {', '.join(others)}: a quick raise would change when they end. "
            "Edit the tenant's overrides on its admin page instead."
        )
    expiry = tenant.overrides_until
    applies = bool(overrides) and (expiry is None or expiry > now)
    if applies and (expiry is None or expiry > until):
        ends = "without end" if expiry is None else f"until {expiry:%Y-%m-%d %H:%M} UTC"
        return (
            f"{tenant.key}'s override at {level} applies {ends}: a quick raise would end it sooner. "
            "Edit it on the tenant's admin page instead."
        )
    return None


def _base_rules(tenant: Tenant | None, level: Level, until: datetime, now: datetime) -> list[dict]:
    """The rules the override starts from: the tenant's own override at the level while it
    applies, else its tier's rules there. Refused where the new expiry would change another
    override's."""
    refusal = why_not(tenant, level.name, until, now)
    if refusal:
        raise QuickRaiseRefused(refusal)
    overrides = list(tenant.rules.select_related("level")) if tenant else []
    expiry = tenant.overrides_until if tenant else None
    applies = bool(overrides) and (expiry is None or expiry > now)
    if applies:
        return [r.spec() for r in overrides]
    tier = tenant.tier if tenant else PolicySettings.load().default_tier
    if tier is None:
        raise QuickRaiseRefused("This team key has no tenant and there is no default tier to start from.")
    return [r.spec() for r in Rule.objects.filter(tier=tier, level=level).order_by("position", "id")]


def _index_of(specs: list[dict], rule: str, level: str) -> int:
    names = [build_rule(spec, "").display() for spec in specs]
    if rule not in names:
        raise StaleVersion(f"the rule {level}: {rule} is no longer among the tenant's rules at {level}")
    return names.index(rule)


def _raised(spec: dict, factor: float) -> dict:
    if not raisable(spec["type"]):
        raise QuickRaiseRefused(f"A {spec['type']} rule has no limit to raise.")
    try:
        scaled = build_rule(spec, "").scaled(factor)
    except ConfigError as error:
        raise QuickRaiseRefused(f"The raised rule would not be valid: {error.path}: {error.reason}.") from None
    return {**spec, **{name: scaled.values[name] for name in type(scaled).scaled_params}}


def _check(level: str, specs: list[dict]) -> None:
    try:
        check_owner("tenant", {level: specs})  # the one check the admin, the API and files share
    except ConfigError as error:
        raise QuickRaiseRefused(f"The raised rules would not build: {error.path}: {error.reason}.") from None


def _save_tenant(tenant: Tenant | None, key: str, until: datetime, reason: str) -> Tenant:
    if tenant is None:
        tenant = Tenant(key=key, tier=PolicySettings.load().default_tier, overrides_until=until)
        tenant._change_reason = f"quick raise: {reason}"
        try:
            with transaction.atomic():
                tenant.save()
        except IntegrityError:  # someone made the tenant since the page was shown
            raise StaleVersion(f"tenant {key} was created since you opened the page") from None
        return tenant
    tenant.overrides_until = until
    tenant._change_reason = f"quick raise: {reason}"
    tenant.save()  # Versioned: refused (StaleVersion) if someone saved it in between
    return tenant


def _rule_from_spec(spec: dict, **fields) -> Rule:
    rule = Rule.from_spec(spec, **fields)
    rule.full_clean()
    return rule
