"""The policy file (SPEC.md, "Policy file"): read, check, load into the store, export.

Checking happens in full before anything is written, and the first error is a ConfigError
whose `path` names the field inside the file (`tiers.pro.user[0].capacity`). Loading
replaces the whole store in one transaction; rows that did not change are left alone, so
the audit trail shows what a load really changed.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.dateparse import parse_datetime

from core import ConfigError
from core.config import parse_fail_modes, parse_levels, parse_priorities
from core.rules import build_rule

from .compile import GLOBAL_LEVEL

TOP_LEVEL_FIELDS = ("default_tier", "levels", "tiers", "global", "tenants", "priorities")
DEFAULT_LEVELS = ({"name": "user"}, {"name": "team"}, {"name": "global"})
RULE_FIELDS = ("type", "label", "shadow", "counts")


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
    except RecursionError:
        raise ConfigError(f"not valid {kind}: nested too deeply") from None
    try:
        # A JSON escape such as "\ud800" gives a lone surrogate, which no database can store.
        json.dumps(doc, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"not valid {kind}: a string holds a lone surrogate (\\ud800 to \\udfff)") from None
    except RecursionError:
        raise ConfigError(f"not valid {kind}: nested too deeply") from None
    return doc


def global_level(levels: tuple[str, ...]) -> str:
    """Where the file's plain `global:` list applies: the `global` level, else the last one."""
    return GLOBAL_LEVEL if GLOBAL_LEVEL in levels or not levels else levels[-1]


# Checking ---------------------------------------------------------------------------------


def check_document(doc: Any) -> dict:
    """The document, checked and normalised; raises ConfigError naming the first bad field."""
    doc = _mapping(doc if doc is not None else {}, "")
    unknown = sorted(set(doc) - set(TOP_LEVEL_FIELDS))
    if unknown:
        raise ConfigError(f"unknown field (known: {', '.join(TOP_LEVEL_FIELDS)})", unknown[0])
    levels = _check_levels(doc.get("levels", list(DEFAULT_LEVELS)))
    names = tuple(level["name"] for level in levels)
    tiers = {
        name: _rules_by_level(spec, names, f"tiers.{name}")
        for name, spec in _mapping(doc.get("tiers", {}), "tiers").items()
    }
    for name, rules in tiers.items():
        _name(name, f"tiers.{name}")
        if not any(rules.values()):
            raise ConfigError("a tier needs at least one rule", f"tiers.{name}")
    global_rules = _check_global(doc.get("global", []), names)
    default_tier = doc.get("default_tier")
    if default_tier is not None and default_tier not in tiers:
        raise ConfigError(f"unknown tier {default_tier!r} (known: {', '.join(tiers) or 'none'})", "default_tier")
    tenants = {
        key: _check_tenant(key, spec, tiers, default_tier, names)
        for key, spec in _mapping(doc.get("tenants", {}), "tenants").items()
    }
    priorities = doc.get("priorities") or {}
    parse_priorities(priorities, names)
    checked = {
        "default_tier": default_tier,
        "levels": levels,
        "tiers": tiers,
        "global": global_rules,
        "tenants": tenants,
        "priorities": {n: dict(p) for n, p in priorities.items()},
    }
    _check_compiles(checked)
    return checked


def _mapping(value: Any, path: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise ConfigError(f"must be a mapping, not {type(value).__name__}", path)
    return value


def _name(value: Any, path: str) -> str:
    from .models import NAME_VALIDATOR

    try:
        NAME_VALIDATOR(value if isinstance(value, str) else "")
    except ValidationError:
        raise ConfigError("must be a name of letters, digits and _ . : -", path) from None
    return value


def _check_levels(levels: Any) -> list[dict]:
    if not isinstance(levels, list) or not levels:
        raise ConfigError("must be a non-empty list of levels", "levels")
    out, seen = [], set()
    for i, level in enumerate(levels):
        level = {"name": level} if isinstance(level, str) else _mapping(level, f"levels[{i}]")
        name = _name(level.get("name"), f"levels[{i}].name")
        if name in seen:
            raise ConfigError(f"level {name!r} appears twice", f"levels[{i}].name")
        seen.add(name)
        spec = {k: v for k, v in level.items() if k != "name"}
        try:
            mode = parse_fail_modes({name: spec}, (name,))[name]
        except ConfigError as error:
            raise ConfigError(error.reason, f"levels[{i}]" + error.path[len(f"fail_modes.{name}") :]) from None
        out.append({"name": name, "fail_mode": mode.mode, "fallback_fraction": mode.fallback_fraction})
    return out


def _rules_by_level(spec: Any, levels: tuple[str, ...], path: str) -> dict[str, list[dict]]:
    out = {}
    for level, rules in _mapping(spec, path).items():
        if level not in levels:
            raise ConfigError(f"unknown level (known: {', '.join(levels)})", f"{path}.{level}")
        out[level] = _check_rules(rules, f"{path}.{level}")
    return out


def _check_rules(rules: Any, path: str) -> list[dict]:
    if not isinstance(rules, list):
        raise ConfigError(f"must be a list of rules, not {type(rules).__name__}", path)
    for i, rule in enumerate(rules):
        build_rule(rule, f"{path}[{i}]")
        _check_row_fields(rule, f"{path}[{i}]")
    return [dict(rule) for rule in rules]


def _check_row_fields(rule: dict, path: str) -> None:
    """What the engine takes but the Rule row cannot hold (a label longer than its column)."""
    from .models import Rule

    try:
        Rule(**_rule_fields(rule)).clean_fields(exclude=["tier", "tenant", "level", "position"])
    except ValidationError as error:
        field, messages = next(iter(error.message_dict.items()))
        raise ConfigError(" ".join(messages), f"{path}.{field}") from None


def _check_global(spec: Any, levels: tuple[str, ...]) -> dict[str, list[dict]]:
    if isinstance(spec, list):
        return {global_level(levels): _check_rules(spec, "global")} if spec else {}
    return _rules_by_level(spec, levels, "global")


def _check_tenant(key: Any, spec: Any, tiers: dict, default_tier: str | None, levels: tuple[str, ...]) -> dict:
    path = f"tenants.{key}"
    if not isinstance(key, str) or not key or len(key) > 200:
        raise ConfigError("a tenant key must be a non-empty string of at most 200 characters", path)
    spec = _mapping(spec if spec is not None else {}, path)
    unknown = sorted(set(spec) - {"tier", "overrides", "overrides_until"})
    if unknown:
        raise ConfigError("unknown field (known: overrides, overrides_until, tier)", f"{path}.{unknown[0]}")
    tier = spec.get("tier", default_tier)
    if tier not in tiers:
        raise ConfigError(f"unknown tier {tier!r} (known: {', '.join(tiers) or 'none'})", f"{path}.tier")
    overrides = _rules_by_level(spec.get("overrides") or {}, levels, f"{path}.overrides")
    return {
        "tier": tier,
        "overrides": overrides,
        "overrides_until": _datetime(spec.get("overrides_until"), f"{path}.overrides_until"),
    }


def _datetime(value: Any, path: str) -> dt.datetime | None:
    if value is None:
        return None
    moment = value if isinstance(value, dt.datetime) else parse_datetime(value) if isinstance(value, str) else None
    if moment is None:
        raise ConfigError("must be a date and time like 2026-12-31T00:00:00Z", path)
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def _check_compiles(checked: dict) -> None:
    """Every tier and every tenant's overrides, with the global rules, must build: the same
    rule twice at one level (one bucket) is refused here rather than at request time."""
    globals_ = checked["global"]
    owners = [(f"tiers.{name}", rules, {}) for name, rules in checked["tiers"].items()]
    owners += [
        (f"tenants.{key}.overrides", checked["tiers"][t["tier"]], t["overrides"])
        for key, t in checked["tenants"].items()
        if t["overrides"]
    ]
    for path, rules, overrides in owners:
        config = {
            level["name"]: [
                *overrides.get(level["name"], rules.get(level["name"], [])),
                *globals_.get(level["name"], []),
            ]
            for level in checked["levels"]
        }
        try:
            parse_levels(config)
        except ConfigError as error:
            raise ConfigError(f"{error.reason} (with the global rules)", f"{path}.{error.path}") from None


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
        from .models import Level, Tenant, Tier

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
                tier.delete()
                del self.tiers[name]
        self._replace_rules()
        self._upsert_priorities()
        Level.objects.exclude(name__in=list(self.levels)).delete()

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
        from .models import Level

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
        from .models import Tenant

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
        from .models import PolicySettings

        settings = PolicySettings.load()
        tier = self.tiers.get(self.doc["default_tier"]) if self.doc["default_tier"] else None
        if settings.default_tier_id != (tier.pk if tier else None):
            settings.default_tier = tier
            settings.save()

    def _replace_rules(self) -> None:
        """Replace the rules of every owner whose rules changed; bump that owner's version."""
        from .models import Rule

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
        from .models import Rule

        kind, name = owner
        row_owner = (
            {"tier": self.tiers.get(name)}
            if kind == "tier"
            else {"tenant": self.tenants.get(name)}
            if kind == "tenant"
            else {}
        )
        if kind != "global" and None in row_owner.values():
            return  # an owner that is gone: its rules went with it
        Rule.objects.filter(tier=row_owner.get("tier"), tenant=row_owner.get("tenant")).delete()
        for level, specs in rules.items():
            for position, spec in enumerate(specs):
                Rule.objects.create(level=self.levels[level], position=position, **row_owner, **_rule_fields(spec))
        for obj in row_owner.values():
            if id(obj) not in self.saved:
                obj.save()  # a new version: a form opened before this load is now stale
                self.saved.add(id(obj))

    def _upsert_priorities(self) -> None:
        from .models import PriorityClass

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


def _rule_fields(spec: dict) -> dict:
    return {
        "type": spec["type"],
        "label": spec.get("label") or "",
        "shadow": spec.get("shadow", False),
        "counts": spec.get("counts", "cost"),
        "params": {k: v for k, v in spec.items() if k not in RULE_FIELDS},
    }


def _normal(rules: dict[str, list[dict]]) -> dict:
    """Rules compared as the store keeps them (a `shadow: false` or `counts: cost` is no change)."""
    from .models import Rule

    return {level: [Rule(**_rule_fields(spec)).spec() for spec in specs] for level, specs in rules.items() if specs}


# Exporting --------------------------------------------------------------------------------


def export_policy() -> dict:
    """The store as a policy document; loading it back gives the same store."""
    from .models import Level, PolicySettings, PriorityClass, Rule, Tenant, Tier

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
