"""The policy file: read, check, load into the store, export.

Checking happens in full before anything is written, and the first error is a ConfigError
whose `path` names the field inside the file (`tiers.pro.user[0].capacity`). The file's
shape is checked here; the policy's invariants by `policies.invariants`, as the admin and
the API check them. Loading
replaces the whole store in one transaction; rows that did not change are left alone, so
the audit trail shows what a load really changed.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from core import ConfigError
from core.config import DEFAULT_FALLBACK_FRACTION, parse_priorities

from .documents import TOO_DEEP, too_deep
from .durations import window_pattern, window_seconds
from .history import replace_rules
from .integrity import check_deletable
from .invariants import (
    PolicyViolation,
    check_alert,
    check_demotions,
    check_fail_mode,
    check_global_rules,
    check_name,
    check_name_length,
    check_owner_rules,
    unknown,
    within,
)
from .models import Alert, Level, PolicySettings, PriorityClass, Rule, Tenant, Tier
from .policy import GLOBAL_LEVEL, Policy, TenantPolicy

TOP_LEVEL_FIELDS = ("default_tier", "levels", "tiers", "global", "tenants", "priorities", "alerts")
DEFAULT_LEVELS = ({"name": "user"}, {"name": "team"}, {"name": "global"})


def read_file(path: str | Path) -> Any:
    """Parse a YAML or JSON policy file; a syntax error is a ConfigError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"cannot read the file: {error.strerror}") from None
    kind = "JSON" if path.suffix.lower() == ".json" else "YAML"
    try:
        doc = json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as error:
        raise ConfigError(f"not valid {kind}: {error}") from None
    except RecursionError:  # deeper than Python's stack
        raise ConfigError(f"the {kind} is {TOO_DEEP}") from None
    # Also a YAML alias inside itself (`&a [*a]`), which json.dumps would refuse with a ValueError.
    if too_deep(doc):
        raise ConfigError(f"the {kind} is {TOO_DEEP}")
    try:
        # A JSON escape such as "\ud800" gives a lone surrogate, which no database can store.
        json.dumps(doc, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"not valid {kind}: a string holds a lone surrogate (\\ud800 to \\udfff)") from None
    return doc


def refusal(file: str | Path, error: ConfigError) -> str:
    """How a command says that a policy file was refused: the file, the path inside it, why."""
    where = f"{file}: {error.path}" if error.path else str(file)
    return f"{where}: {error.reason}"


def global_level(levels: tuple[str, ...]) -> str:
    """Where the file's plain `global:` list applies: the `global` level, else the last one."""
    return GLOBAL_LEVEL if GLOBAL_LEVEL in levels or not levels else levels[-1]


# Checking ---------------------------------------------------------------------------------


def check_document(doc: Any, now: Callable[[], dt.datetime] = timezone.now) -> dict:
    """The document, checked and normalised; raises ConfigError naming the first bad field.
    `now`: the moment an `overrides_until` given as a duration (`90d`) counts from."""
    doc = _mapping(doc if doc is not None else {}, "")
    unknown_fields = sorted(set(doc) - set(TOP_LEVEL_FIELDS))
    if unknown_fields:
        raise ConfigError(f"unknown field (known: {', '.join(TOP_LEVEL_FIELDS)})", unknown_fields[0])
    levels = check_levels(doc.get("levels", list(DEFAULT_LEVELS)))
    names = tuple(level["name"] for level in levels)
    global_rules = _check_global(doc.get("global", []), names)
    tiers = {}
    for name, spec in _mapping(doc.get("tiers", {}), "tiers").items():
        _name(name, f"tiers.{name}", f"tiers.{name}.name")
        tiers[name] = _owner_rules("tier", spec, names, global_rules, f"tiers.{name}")
    default_tier = doc.get("default_tier")
    if default_tier is not None and not _names_one_of(default_tier, tiers):
        raise ConfigError(unknown("tier", default_tier, tiers), "default_tier")
    tenants = {
        key: _check_tenant(key, spec, tiers, default_tier, names, global_rules, now)
        for key, spec in _mapping(doc.get("tenants", {}), "tenants").items()
    }
    priorities = doc.get("priorities")
    priorities = {} if priorities is None else _mapping(priorities, "priorities")
    for name in priorities:
        _name(name, f"priorities.{name}", f"priorities.{name}.name")
    parse_priorities(priorities, names)  # the watermark's bounds: policies.invariants.check_watermark's
    owners = [("global", global_rules), *((f"tiers.{n}", r) for n, r in tiers.items())]
    owners += [(f"tenants.{key}.overrides", tenant["overrides"]) for key, tenant in tenants.items()]
    for path, rules in owners:
        try:
            check_demotions(rules, priorities)
        except PolicyViolation as error:
            raise within(path, error) from None
    alerts = doc.get("alerts")
    return {
        "default_tier": default_tier,
        "levels": levels,
        "tiers": tiers,
        "global": global_rules,
        "tenants": tenants,
        "priorities": {n: dict(p) for n, p in priorities.items()},
        "alerts": {
            name: _check_alert(name, spec)
            for name, spec in _mapping({} if alerts is None else alerts, "alerts").items()
        },
    }


def _check_alert(name: Any, spec: Any) -> dict:
    """An alert of the file: its name, its fields (policies.invariants.check_alert), and its
    secret from `secret_env` (an environment variable's name) or `secret`; none at all keeps
    the secret of the alert stored under that name (an exported file has none)."""
    path = f"alerts.{name}"
    _name(name, path, f"{path}.name")
    spec = dict(_mapping(spec, path))
    if "secret_env" in spec:
        variable = spec.pop("secret_env")
        if "secret" in spec:
            raise ConfigError("give secret_env or secret, not both", f"{path}.secret")
        if not isinstance(variable, str) or not os.environ.get(variable):
            raise ConfigError(f"names no environment variable that is set: {variable!r}", f"{path}.secret_env")
        spec["secret"] = os.environ[variable]
    try:
        return check_alert(spec, secret_required=False)
    except PolicyViolation as error:
        raise within(path, error) from None


def _names_one_of(name: Any, known: Mapping) -> bool:
    """Whether `name` is one of the names in `known` (a list or mapping is no name at all)."""
    return isinstance(name, str) and name in known


def _mapping(value: Any, path: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise ConfigError(f"must be a mapping, not {type(value).__name__}", path)
    return value


def _name(value: Any, path: str, length_path: str | None = None) -> str:
    """A name, refused at `path`; one too long for its row at `length_path` (the row's field)."""
    try:
        check_name(value)
    except PolicyViolation as error:
        raise within(path, error) from None
    try:
        return check_name_length(value)
    except PolicyViolation as error:
        raise within(length_path or path, error) from None


def check_levels(levels: Any) -> list[dict]:
    """The document's `levels`, checked and normalised (names, fail modes); ConfigError else."""
    if not isinstance(levels, list) or not levels:
        raise ConfigError("must be a non-empty list of levels", "levels")
    out, seen = [], set()
    for i, level in enumerate(levels):
        level = {"name": level} if isinstance(level, str) else _mapping(level, f"levels[{i}]")
        name = _name(level.get("name"), f"levels[{i}].name")
        if name in seen:
            raise ConfigError(f"level {name!r} appears twice", f"levels[{i}].name")
        seen.add(name)
        extra = sorted(set(level) - {"name", "fail_mode", "fallback_fraction"})
        if extra:
            raise ConfigError(f"unknown field {extra[0]!r} (known: fail_mode, fallback_fraction, name)", f"levels[{i}]")
        try:
            mode = check_fail_mode(
                level.get("fail_mode", "open"), level.get("fallback_fraction", DEFAULT_FALLBACK_FRACTION)
            )
        except PolicyViolation as error:
            raise within(f"levels[{i}]", error) from None
        out.append({"name": name, "fail_mode": mode.mode, "fallback_fraction": mode.fallback_fraction})
    return out


def _rules_by_level(spec: Any, levels: tuple[str, ...], path: str) -> dict[str, list[dict]]:
    """The file's shape of rules: a mapping of known level names to lists of mappings."""
    out = {}
    for level, rules in _mapping(spec, path).items():
        if level not in levels:
            raise ConfigError(unknown("level", level, levels), f"{path}.{level}")
        if not isinstance(rules, list):
            raise ConfigError(f"must be a list of rules, not {type(rules).__name__}", f"{path}.{level}")
        out[level] = [dict(rule) if isinstance(rule, Mapping) else rule for rule in rules]
    return out


def _owner_rules(kind: str, spec: Any, levels: tuple[str, ...], global_rules: dict, path: str) -> dict:
    """A tier's rules or a tenant's overrides, checked with the file's global rules; or the
    global rules by level (`kind` "global"), checked among themselves."""
    rules = _rules_by_level(spec, levels, path)
    try:
        if kind == "global":
            check_global_rules(rules)
        else:
            check_owner_rules(kind, rules, global_rules)
    except PolicyViolation as error:
        raise within(path, error) from None
    return rules


def _check_global(spec: Any, levels: tuple[str, ...]) -> dict[str, list[dict]]:
    """The file's global rules: by level, or a plain list for the `global` level (else the last)."""
    if not isinstance(spec, list):
        return _owner_rules("global", spec, levels, {}, "global")
    level = global_level(levels)
    rules = {level: [dict(rule) if isinstance(rule, Mapping) else rule for rule in spec]} if spec else {}
    try:
        check_global_rules(rules)
    except PolicyViolation as error:
        # A plain list's rules are named `global[1]`, not by the level they go to.
        raise ConfigError(error.reason, "global" + error.path[len(level) :]) from None
    return rules


def _check_tenant(
    key: Any,
    spec: Any,
    tiers: dict,
    default_tier: str | None,
    levels: tuple[str, ...],
    global_rules: dict,
    now: Callable[[], dt.datetime],
) -> dict:
    path = f"tenants.{key}"
    if not isinstance(key, str) or not key or len(key) > 200:
        raise ConfigError("a tenant key must be a non-empty string of at most 200 characters", path)
    spec = _mapping(spec if spec is not None else {}, path)
    extra = sorted(set(spec) - {"tier", "overrides", "overrides_until"})
    if extra:
        raise ConfigError("unknown field (known: overrides, overrides_until, tier)", f"{path}.{extra[0]}")
    tier = spec.get("tier", default_tier)
    if not _names_one_of(tier, tiers):
        raise ConfigError(unknown("tier", tier, tiers), f"{path}.tier")
    # Overrides replace the tier's rules at their levels, which were checked with the tier.
    given = spec.get("overrides")
    overrides = _owner_rules("tenant", {} if given is None else given, levels, global_rules, f"{path}.overrides")
    return {
        "tier": tier,
        "overrides": overrides,
        "overrides_until": _until(spec.get("overrides_until"), f"{path}.overrides_until", now),
    }


# `overrides_until` as a duration from the load, in whole hours or days up to ten years: `90d`.
UNTIL_FROM_NOW = window_pattern(3650 * 86400, "hd")


def _until(value: Any, path: str, now: Callable[[], dt.datetime]) -> dt.datetime | None:
    """A moment, or a duration from `now` (whole seconds): a file whose override lasts 90 days
    from each load (the demo's), where a date would have passed a year later."""
    seconds = window_seconds(value, UNTIL_FROM_NOW)
    if seconds is None:
        return _datetime(value, path)
    return (now() + dt.timedelta(seconds=seconds)).astimezone(dt.UTC).replace(microsecond=0)


def _datetime(value: Any, path: str) -> dt.datetime | None:
    if value is None:
        return None
    moment = value if isinstance(value, dt.datetime) else parse_datetime(value) if isinstance(value, str) else None
    if moment is None:
        raise ConfigError("must be a date and time like 2026-12-31T00:00:00Z, or a time from the load like 90d", path)
    if moment.tzinfo is None:
        return moment.replace(tzinfo=dt.UTC)
    # Kept in UTC: PostgreSQL refuses offsets past 15:59 that Python parses (-21:00).
    try:
        return moment.astimezone(dt.UTC)
    except OverflowError:
        raise ConfigError("is out of range once in UTC", path) from None


# Loading ----------------------------------------------------------------------------------


def load_policy(doc: Any) -> dict:
    """Check `doc`, then make the store equal to it in one transaction. Raises ConfigError
    (and changes nothing) if the document or any row it makes is invalid."""
    checked = check_document(doc)
    with transaction.atomic():
        _Loader(checked).run()
    return checked


class _Loader:
    def __init__(self, checked: dict) -> None:
        self.doc = checked
        self.saved: set[int] = set()  # id() of the rows saved by this load: one new version each

    def run(self) -> None:
        self.levels = self._upsert_levels()
        self.tiers = {t.name: t for t in Tier.objects.all()}
        for name in self.doc["tiers"]:
            if name not in self.tiers:
                self.tiers[name] = self._saved(Tier(name=name), f"tiers.{name}")
        Tenant.objects.exclude(key__in=list(self.doc["tenants"])).delete()
        self.tenants = self._upsert_tenants()
        self._set_default_tier()
        for name, tier in list(self.tiers.items()):
            if name not in self.doc["tiers"]:
                self._delete(tier, f"tiers.{name}")
                del self.tiers[name]
        self._replace_rules()
        self._upsert_priorities()
        for level in Level.objects.exclude(name__in=list(self.levels)):
            self._delete(level, "levels")
        self._upsert_alerts()

    @staticmethod
    def _delete(row, path: str) -> None:
        # The rows that relied on it were replaced or removed first, so this holds; checked
        # all the same, as every deletion is (policies.invariants).
        try:
            check_deletable(row)
        except PolicyViolation as error:
            raise ConfigError(error.reason, path) from None
        row.delete()

    def _saved(self, obj, path: str):
        try:
            obj.full_clean()
        except ValidationError as error:
            field, messages = next(iter(error.message_dict.items()))
            raise ConfigError(" ".join(messages), path if field == "__all__" else f"{path}.{field}") from None
        obj.save()
        self.saved.add(id(obj))
        return obj

    def _upsert_levels(self) -> dict:
        existing = {level.name: level for level in Level.objects.all()}
        out = {}
        for position, spec in enumerate(self.doc["levels"]):
            level = existing.get(spec["name"]) or Level(name=spec["name"])
            wanted = {
                "position": position,
                "fail_mode": spec["fail_mode"],
                "fallback_fraction": spec["fallback_fraction"],
            }
            if level.pk is None or any(getattr(level, k) != v for k, v in wanted.items()):
                for k, v in wanted.items():
                    setattr(level, k, v)
                self._saved(level, f"levels[{position}]")
            out[level.name] = level
        return out

    def _upsert_tenants(self) -> dict:
        existing = {tenant.key: tenant for tenant in Tenant.objects.all()}
        out = {}
        for key, spec in self.doc["tenants"].items():
            tenant = existing.get(key) or Tenant(key=key)
            tier = self.tiers[spec["tier"]]
            if tenant.pk is None or tenant.tier_id != tier.pk or tenant.overrides_until != spec["overrides_until"]:
                tenant.tier, tenant.overrides_until = tier, spec["overrides_until"]
                self._saved(tenant, f"tenants.{key}")
            out[key] = tenant
        return out

    def _set_default_tier(self) -> None:
        settings = PolicySettings.load()
        tier = self.tiers.get(self.doc["default_tier"]) if self.doc["default_tier"] else None
        if settings.default_tier_id != (tier.pk if tier else None):
            settings.default_tier = tier
            settings.save()

    def _replace_rules(self) -> None:
        """Replace the rules of every owner whose rules changed; bump that owner's version."""
        wanted = {("tier", name): rules for name, rules in self.doc["tiers"].items()}
        wanted |= {("tenant", key): t["overrides"] for key, t in self.doc["tenants"].items()}
        wanted[("global", None)] = self.doc["global"]
        current: dict[tuple, dict[str, list[dict]]] = {}
        for rule in Rule.objects.select_related("tier", "tenant", "level").order_by("position", "id"):
            owner = (
                ("tier", rule.tier.name)
                if rule.tier
                else ("tenant", rule.tenant.key)
                if rule.tenant
                else ("global", None)
            )
            current.setdefault(owner, {}).setdefault(rule.level.name, []).append(rule.spec())
        for owner in set(wanted) | set(current):
            if _normal(wanted.get(owner, {})) != _normal(current.get(owner, {})):
                self._write_rules(owner, wanted.get(owner, {}))

    def _write_rules(self, owner: tuple, rules: dict[str, list[dict]]) -> None:
        kind, name = owner
        row = self.tiers.get(name) if kind == "tier" else self.tenants.get(name) if kind == "tenant" else None
        if kind != "global" and row is None:
            return  # an owner that is gone: its rules went with it
        if row is not None and id(row) not in self.saved:
            # Saved first, then its rules: a new version (a form opened before this load is now
            # stale), and the history's record of it then holds these rules.
            row.save()
            self.saved.add(id(row))
        replace_rules(row, rules, self.levels)

    def _upsert_priorities(self) -> None:
        existing = {p.name: p for p in PriorityClass.objects.prefetch_related("levels")}
        for name in set(existing) - set(self.doc["priorities"]):
            existing[name].delete()
        for name, spec in self.doc["priorities"].items():
            priority = existing.get(name) or PriorityClass(name=name)
            levels = [self.levels[level] for level in spec.get("levels", [])]
            held = {level.pk for level in priority.levels.all()} if priority.pk is not None else set()
            new_levels = held != {level.pk for level in levels}
            # Saved when only its levels change too: a new version, so that a page opened
            # before this load is now stale.
            if priority.pk is None or new_levels or priority.watermark != spec.get("watermark", 0.0):
                priority.watermark = float(spec.get("watermark", 0.0))
                self._saved(priority, f"priorities.{name}")
            if new_levels:
                priority.levels.set(levels)

    def _upsert_alerts(self) -> None:
        """The file's alerts, and no other; one without a secret keeps the stored one's."""
        existing = {alert.name: alert for alert in Alert.objects.all()}
        for name in set(existing) - set(self.doc["alerts"]):
            existing[name].delete()
        for name, spec in self.doc["alerts"].items():
            alert = existing.get(name) or Alert(name=name)
            if alert.pk is None and "secret" not in spec:
                raise ConfigError(
                    "a new alert needs a secret: secret_env (an environment variable's name) or secret",
                    f"alerts.{name}.secret",
                )
            wanted = {**spec, "window": spec.get("window", "")}
            if alert.pk is None or any(getattr(alert, field) != value for field, value in wanted.items()):
                for field, value in wanted.items():
                    setattr(alert, field, value)
                self._saved(alert, f"alerts.{name}")


def _normal(rules: dict[str, list[dict]]) -> dict:
    """Rules compared as the store keeps them (a `shadow: false` or `counts: cost` is no change)."""
    return {level: [Rule.from_spec(spec).spec() for spec in specs] for level, specs in rules.items() if specs}


def document_policy(checked: dict, version: int = 0) -> Policy:
    """The Policy a checked document (`check_document`) would be once loaded, read as workers
    read one (policies.compile.read_policy), without writing a row: what the what-if replays
    a draft under. Rules as the store keeps them (`_normal`), levels in the document's order."""
    levels = tuple(level["name"] for level in checked["levels"])
    tenants = {
        key: TenantPolicy(
            spec["tier"],
            _normal(spec["overrides"]),
            spec["overrides_until"].timestamp() if spec["overrides_until"] is not None else None,
        )
        for key, spec in checked["tenants"].items()
    }
    priorities = {}
    for name, spec in checked["priorities"].items():
        priority: dict[str, Any] = {"watermark": float(spec.get("watermark", 0.0))}
        if spec.get("levels"):
            priority["levels"] = list(spec["levels"])
        priorities[name] = priority
    return Policy(
        version=version,
        levels=levels,
        fail_modes={
            level["name"]: {"fail_mode": level["fail_mode"], "fallback_fraction": level["fallback_fraction"]}
            for level in checked["levels"]
        },
        tiers={name: _normal(rules) for name, rules in checked["tiers"].items()},
        global_rules=_normal(checked["global"]),
        tenants=tenants,
        default_tier=checked["default_tier"],
        priorities=priorities,
    )


# Exporting --------------------------------------------------------------------------------


def export_policy() -> dict:
    """The store as a policy document; loading it back gives the same store."""
    levels = list(Level.objects.order_by("position", "name"))
    doc: dict[str, Any] = {}
    settings = PolicySettings.objects.filter(pk=1).select_related("default_tier").first()
    if settings and settings.default_tier:
        doc["default_tier"] = settings.default_tier.name
    doc["levels"] = [_export_level(level) for level in levels]
    tiers: dict[str, dict] = {tier.name: {} for tier in Tier.objects.order_by("name")}
    overrides: dict[str, dict] = {}
    global_rules: dict[str, list] = {}
    for rule in Rule.objects.select_related("tier", "tenant", "level").order_by("level__position", "position", "id"):
        target = (
            tiers[rule.tier.name]
            if rule.tier
            else overrides.setdefault(rule.tenant.key, {})
            if rule.tenant
            else global_rules
        )
        target.setdefault(rule.level.name, []).append(rule.spec())
    doc["tiers"] = tiers
    where = global_level(tuple(level.name for level in levels))
    doc["global"] = global_rules.get(where, []) if set(global_rules) <= {where} else global_rules
    doc["tenants"] = {}
    for tenant in Tenant.objects.select_related("tier").order_by("key"):
        spec: dict[str, Any] = {"tier": tenant.tier.name}
        if tenant.key in overrides:
            spec["overrides"] = overrides[tenant.key]
        if tenant.overrides_until:
            spec["overrides_until"] = tenant.overrides_until.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
        doc["tenants"][tenant.key] = spec
    doc["priorities"] = {}
    for priority in PriorityClass.objects.prefetch_related("levels").order_by("name"):
        spec = {"watermark": priority.watermark}
        names = [level.name for level in sorted(priority.levels.all(), key=lambda lv: (lv.position, lv.name))]
        if names:
            spec["levels"] = names
        doc["priorities"][priority.name] = spec
    alerts = {alert.name: alert.spec() for alert in Alert.objects.order_by("name")}
    if alerts:  # their secrets are left out: a loaded file keeps the stored ones (docs/OPERATIONS.md)
        doc["alerts"] = alerts
    return doc


def _export_level(level) -> dict:
    out = {"name": level.name, "fail_mode": level.fail_mode}
    if level.fail_mode == "local" or level.fallback_fraction != 0.25:
        out["fallback_fraction"] = level.fallback_fraction
    return out


def dump(doc: dict, path: str | None) -> str:
    """The document as JSON (for a .json path) or YAML."""
    if path and path.lower().endswith(".json"):
        return json.dumps(doc, indent=2) + "\n"
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=110)
