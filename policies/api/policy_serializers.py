"""The policy's shapes on the wire: tiers, tenants, levels, priority classes, the settings.

A tier's rules have the policy file's shape, rule specs by level name:

    {"name": "pro", "rules": {"user": [{"type": "sliding_window", "limit": 600, "window": 60}]},
     "version": 3}

Nothing here decides what is valid: the policy's invariants are `policies.invariants`' (a
row's own through its model's `full_clean`), as the admin and the policy file check them.
This module only says where an error is (`rules.user.0.capacity`) and whether it is a 400
or a 409 (a conflict with what is stored). On top of that every serializer is strict: an
unknown field is refused, `version` is the optimistic lock of every row but the settings,
and a PUT must send every field (a forgotten field is an error, never a silent reset).
"""

from __future__ import annotations

import datetime as dt
import math
import re
import sys
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import MaxValueValidator, RegexValidator
from drf_spectacular.extensions import OpenApiSerializerExtension, OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core import RULES
from core.config import FAIL_MODES
from policies.invariants import NAME_VALIDATOR, PolicyViolation, check_owner_rules, check_rule, unknown
from policies.models import Level, PolicySettings, PriorityClass, Rule, Tenant, Tier, replace_rules, rule_specs

from .errors import conflict
from .schema_hooks import keyed_by_level, names_of

VERSION_HELP = (
    "Optimistic lock: the version you read. Required by PUT and PATCH (409 if the row changed "
    "since); set by the server, so leave it out when creating."
)


# Where an error is ----------------------------------------------------------------------


def engine_path(path: str) -> str:
    """The engine's `user[1].capacity` as the API's dotted `user.1.capacity`."""
    return re.sub(r"\[(\d+)\]", r".\1", path).strip(".")


def full_clean(row, exclude: tuple[str, ...] = (), prefix: str = "") -> None:
    """The model's own validation; its errors keyed by field (`prefix` before each name).
    A clash with an existing row's unique name is a 409, not a 400."""
    try:
        row.full_clean(exclude=list(exclude))
    except DjangoValidationError as error:
        errors = error.error_dict if hasattr(error, "error_dict") else {NON_FIELD_ERRORS: error.error_list}
        for field, items in errors.items():
            taken = [item for item in items if item.code == "unique"]
            if taken and field != NON_FIELD_ERRORS:
                raise conflict(taken[0].messages[0], f"{prefix}{field}") from None
        raise serializers.ValidationError(
            {
                (prefix.rstrip(".") or "non_field_errors") if field == NON_FIELD_ERRORS else f"{prefix}{field}": [
                    message for item in items for message in item.messages
                ]
                for field, items in errors.items()
            }
        ) from None


# Rules ----------------------------------------------------------------------------------


def refusal(error: PolicyViolation, field: str) -> Exception:
    """A violation of a policy invariant as the API answers it: a 409 for a conflict with what
    is stored, else a 400; either names `field` and the violation's path below it."""
    path = ".".join(part for part in (field, engine_path(error.path)) if part)
    if error.conflict:
        return conflict(error.reason, path)
    return serializers.ValidationError({path or "non_field_errors": error.reason})


class RuleMapField(serializers.Field):
    """Rule specs by level name. Reads as `{level: [spec, ...]}`, each spec checked on its
    own (`check_rule`); a level given `null` or `[]` has no rules (on PATCH: its rules are
    removed). The owner's serializer checks them together (`check_owner_rules`).

    `allow_empty=False`: the owner needs a rule somewhere. Its serializer checks that on the
    rules it will have (on PATCH, with those it keeps); the schema states it for POST and PUT."""

    def __init__(self, allow_empty: bool = True, **kwargs):
        self.allow_empty = allow_empty
        super().__init__(**kwargs)

    def to_representation(self, rules):
        return rule_specs(rules.all())  # the views prefetch rules__level

    def to_internal_value(self, data: Any) -> dict[str, list[dict]]:
        if not isinstance(data, Mapping):
            raise serializers.ValidationError(
                "must be an object mapping level names to lists of rules, "
                'e.g. {"user": [{"type": "token_bucket", ...}]}'
            )
        levels = list(Level.objects.values_list("name", flat=True))
        out = {}
        for name, specs in data.items():
            if name not in levels:
                raise serializers.ValidationError({name: unknown("level", name, levels)})
            if specs is not None and not isinstance(specs, list):
                raise serializers.ValidationError({name: f"must be a list of rules, not {type(specs).__name__}"})
            for i, spec in enumerate(specs or []):
                try:
                    check_rule(spec, f"{name}[{i}]")
                except PolicyViolation as error:
                    raise refusal(error, "") from None
            out[name] = list(specs or [])
        return out


def merged_rules(current, given: dict[str, list[dict]] | None, partial: bool) -> dict[str, list[dict]]:
    """The rules an owner will have: `given` alone, or on PATCH `given` over `current`,
    level by level (a level not named keeps its rules)."""
    out = rule_specs(current.select_related("level")) if partial and current is not None else {}
    out.update(given or {})
    return {level: rules for level, rules in out.items() if rules}


def check_rules(kind: str, rules: dict[str, list[dict]], field: str) -> None:
    """The rules of a tier or tenant with the global rules: a repeat is a 409, named at
    `field.level.i`; anything else a 400."""
    try:
        check_owner_rules(kind, rules)
    except PolicyViolation as error:
        raise refusal(error, field) from None


class RuleMapExtension(OpenApiSerializerFieldExtension):
    """Rule specs by level in the schema. A spec is one of a component per registered rule
    type, with the parameters it declares (core.Param.schema): a new type documents itself."""

    target_class = RuleMapField

    def map_serializer_field(self, auto_schema, direction):
        mapping = {}
        for name in sorted(RULES):
            variant = ResolvedComponent(
                name=_component_name(name),
                type=ResolvedComponent.SCHEMA,
                object=f"rule:{name}",
                schema=rule_type_schema(name),
            )
            auto_schema.registry.register_on_missing(variant)
            mapping[name] = variant.ref["$ref"]
        spec = ResolvedComponent(
            name="RuleSpec",
            type=ResolvedComponent.SCHEMA,
            object="RuleSpec",
            schema={
                "oneOf": [{"$ref": ref} for ref in mapping.values()],
                "discriminator": {"propertyName": "type", "mapping": mapping},
                "description": "A rule, as in the policy file: its type, the type's parameters, and optionally "
                "label, shadow and counts.",
            },
        )
        auto_schema.registry.register_on_missing(spec)
        # null or [] for a level: no rules there.
        rules = {"type": "array", "items": spec.ref, "nullable": True}
        whole = direction == "request" and auto_schema.method in ("POST", "PUT")
        return keyed_by_level(
            rules,
            not_empty=whole and not self.target.allow_empty,
            example={"user": [{"type": "token_bucket", "capacity": 10, "per_second": 1}]},
        )


def _component_name(rule_type: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", rule_type)) + "Rule"


def rule_type_schema(name: str) -> dict:
    params = RULES[name].params
    return {
        "type": "object",
        "description": (RULES[name].__doc__ or "").strip().split("\n")[0],
        "properties": {
            "type": {"type": "string", "enum": [name]},
            **{param.name: _openapi_30(param.schema()) for param in params},
            "label": {
                "type": "string",
                "nullable": True,
                "pattern": NOT_BLANK,
                "maxLength": Rule._meta.get_field("label").max_length,
                "description": "The reason code a denial reports, e.g. RPM_LIMIT; null for none.",
            },
            "shadow": {"type": "boolean", "default": False, "description": "Evaluated and counted, never denies."},
            "counts": {
                "type": "string",
                "enum": ["cost", "requests"],
                "default": "cost",
                "description": "Take the request's cost, or 1 per request.",
            },
        },
        "required": ["type", *(param.name for param in params if param.required)],
        "additionalProperties": False,
    }


# Some character that Python's str.strip() keeps: the engine refuses a blank label. Spelled
# out, since a pattern's \s is not Python's (no \x1c-\x1f or \x85, but \ufeff).
NOT_BLANK = r"[^\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"


def _openapi_30(schema: dict) -> dict:
    """A Param's JSON-schema fragment as OpenAPI 3.0 spells it (a boolean exclusiveMinimum)."""
    out = {k: list(v) if isinstance(v, tuple) else v for k, v in schema.items()}
    if "exclusiveMinimum" in out:
        out["minimum"], out["exclusiveMinimum"] = out["exclusiveMinimum"], True
    return out


# Strictness shared by every resource -------------------------------------------------------


class StrictCharField(serializers.CharField):
    """A string, and only a string, taken as sent: DRF's CharField would take the number 5
    for "5" and " acme " for "acme", and types are strict here (docs/API.md)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    """A JSON whole number only: DRF's IntegerField would take "3" and 3.0."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    """A finite JSON number only: DRF's FloatField would take "0.5" and true, and fail with
    a 500 on an integer past a float's range."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            self.fail("invalid")
        if isinstance(data, int) and abs(data) > sys.float_info.max or not math.isfinite(data):
            raise serializers.ValidationError("must be a finite number")
        return super().to_internal_value(data)


class StrictSerializer(serializers.Serializer):
    """Refuses unknown fields; on PUT (`instance` given, not partial) needs every writable
    field; handles `version`, the optimistic lock, when the model has one."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        StrictSerializerSchema.for_serializer(cls)  # its request bodies, as it reads them

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            known = [name for name, field in self.fields.items()]
            for name in data:
                if name not in self.fields:
                    raise serializers.ValidationError({name: f"unknown field (known: {', '.join(known)})"})
            self._check_version(data)
            if self.instance is not None and not self.partial:
                for name, field in self.fields.items():
                    if not field.read_only and name not in data:
                        raise serializers.ValidationError(
                            {
                                name: "this field is required: PUT replaces the whole resource (PATCH changes "
                                "only the fields it sends)"
                            }
                        )
        return super().to_internal_value(data)

    def _check_version(self, data: Mapping) -> None:
        if "version" not in self.fields:
            return
        if self.instance is None:
            if "version" in data:
                raise serializers.ValidationError(
                    {"version": "read-only: the server sets it; leave it out when creating"}
                )
            return
        if "version" not in data:
            raise serializers.ValidationError({"version": "this field is required: send the version you read"})
        sent = data["version"]
        if isinstance(sent, bool) or not isinstance(sent, int):
            raise serializers.ValidationError({"version": "must be a whole number: the version you read"})
        if sent != self.instance.version:
            raise conflict(
                f"{self.instance._meta.verbose_name} {self.instance} changed since you read it: it is at "
                f"version {self.instance.version}, you sent {sent}. Read it again and reapply your "
                f"change.",
                "version",
            )


# DRF refuses NUL in any string; the schema says so with this pattern.
NO_NUL = RegexValidator(r"\A[^\x00]*\Z", "Null characters are not allowed.")


def name_field(model, **kwargs) -> StrictCharField:
    """A row's name: letters, digits and _ . : - only, as long as the model's column."""
    return StrictCharField(max_length=model._meta.get_field("name").max_length, validators=[NAME_VALIDATOR], **kwargs)


def largest(model, field: str) -> int:
    """The largest value the database takes in an integer column (Django's own bound)."""
    return min(v.limit_value for v in model._meta.get_field(field).validators if isinstance(v, MaxValueValidator))


# core.config's bounds (parse_fail_modes, parse_priorities), as the schema states them.
@extend_schema_field({"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1})
class FallbackFraction(StrictFloatField):
    """Above 0, at most 1."""


@extend_schema_field({"type": "number", "minimum": 0, "maximum": 1, "exclusiveMaximum": True})
class Watermark(StrictFloatField):
    """From 0 up to (not including) 1."""


def version_field():
    return serializers.IntegerField(min_value=1, required=False, help_text=VERSION_HELP)


class StrictSerializerSchema(OpenApiSerializerExtension):
    """A StrictSerializer's request bodies as it reads them: a create sends no `version`
    (its own component, `New<Name>Request`), a PUT sends every field and `version`, a PATCH
    sends `version` and the fields it changes.

    Each StrictSerializer gets a subclass of its own that targets it (`for_serializer`), so
    that `map_serializer` starts from drf-spectacular's own mapping of it, as its extension
    API documents, and changes only the request bodies."""

    target_class = None  # set by each serializer's own subclass

    @classmethod
    def for_serializer(cls, serializer: type) -> None:
        type(f"{serializer.__name__}Schema", (cls,), {"target_class": serializer})

    def get_name(self, auto_schema, direction):
        if direction == "request" and auto_schema.method == "POST" and "version" in self.target.fields:
            return "New" + type(self.target).__name__.removesuffix("Serializer")
        return None

    def map_serializer(self, auto_schema, direction):
        schema = super().map_serializer(auto_schema, direction)
        if direction != "request":
            return schema
        properties = schema["properties"]
        if auto_schema.method == "POST":
            properties.pop("version", None)
            required = [name for name in schema.get("required", []) if name != "version"]
        elif auto_schema.method == "PUT":
            required = [name for name, field in self.target.fields.items() if not field.read_only]
        else:
            required = ["version"] if "version" in properties else []
        schema.pop("required", None)
        if required:
            schema["required"] = required
        return schema


# Tiers and tenants ------------------------------------------------------------------------


class TierSerializer(StrictSerializer):
    """A plan: its rules by level."""

    name = name_field(Tier, help_text="e.g. free, pro")
    rules = RuleMapField(
        allow_empty=False,
        help_text="Rule specs by level name, as in the policy file. At least one rule. "
        "PATCH replaces the levels it names (null or [] removes a level's rules).",
    )
    version = version_field()

    def validate(self, attrs):
        tier = self.instance or Tier()
        tier.name = attrs.get("name", tier.name)
        full_clean(tier)
        rules = merged_rules(self.instance.rules if self.instance else None, attrs.get("rules"), self.partial)
        check_rules("tier", rules, "rules")
        return {"tier": tier, "rules": rules}

    def create(self, validated):
        return self._save(validated)

    def update(self, instance, validated):
        return self._save(validated)

    @staticmethod
    def _save(validated) -> Tier:
        tier = validated["tier"]
        tier.save()  # an update whose version moved since the check raises StaleVersion
        replace_rules(tier, validated["rules"])
        return tier


@extend_schema_field(names_of("tier"))
class TierName(serializers.SlugRelatedField):
    """A configured tier, by its name (the live schema lists them)."""

    def fail(self, key, **kwargs):
        if key == "does_not_exist":
            known = Tier.objects.values_list("name", flat=True)
            raise serializers.ValidationError(unknown("tier", kwargs["value"], known), code=key)
        super().fail(key, **kwargs)


class TenantSerializer(StrictSerializer):
    """A team key with its tier and optional per-level overrides."""

    key = StrictCharField(
        max_length=Tenant._meta.get_field("key").max_length,
        validators=[NO_NUL],
        help_text="The team key requests carry.",
    )
    tier = TierName(slug_field="name", queryset=Tier.objects.all())
    overrides = RuleMapField(
        source="rules",
        required=False,
        help_text="Rule specs by level name; each replaces the tier's rules at its level "
        "until overrides_until. PATCH replaces the levels it names.",
    )
    overrides_until = serializers.DateTimeField(
        required=False,
        allow_null=True,
        default_timezone=dt.UTC,
        help_text="Overrides stop applying then; null: never. A time without a zone is UTC.",
    )
    version = version_field()

    def validate(self, attrs):
        tenant = self.instance or Tenant()
        for field in ("key", "tier", "overrides_until"):
            if field in attrs:
                setattr(tenant, field, attrs[field])
        full_clean(tenant)
        rules = merged_rules(self.instance.rules if self.instance else None, attrs.get("rules"), self.partial)
        check_rules("tenant", rules, "overrides")
        return {"tenant": tenant, "rules": rules}

    def create(self, validated):
        return self._save(validated)

    def update(self, instance, validated):
        return self._save(validated)

    @staticmethod
    def _save(validated) -> Tenant:
        tenant = validated["tenant"]
        tenant.save()
        replace_rules(tenant, validated["rules"])
        return tenant


# Levels, priority classes, settings ------------------------------------------------------------


class LevelSerializer(StrictSerializer):
    """A named scope, in evaluation order, with what it does while the store is down."""

    name = name_field(Level)
    position = StrictIntegerField(
        min_value=0,
        max_value=largest(Level, "position"),
        required=False,
        help_text="Evaluation order, lower first. Default: after the last level.",
    )
    fail_mode = serializers.ChoiceField(
        choices=FAIL_MODES,
        required=False,
        help_text=Level._meta.get_field("fail_mode").help_text,
    )
    fallback_fraction = FallbackFraction(required=False, help_text=Level._meta.get_field("fallback_fraction").help_text)
    version = version_field()

    def validate(self, attrs):
        level = self.instance or Level()
        if self.instance is None and "position" not in attrs:
            last = Level.objects.order_by("-position").values_list("position", flat=True).first()
            attrs["position"] = 0 if last is None else last + 1
        for field in ("name", "position", "fail_mode", "fallback_fraction"):
            if field in attrs:
                setattr(level, field, attrs[field])
        full_clean(level)
        return {"level": level}

    def create(self, validated):
        validated["level"].save()
        return validated["level"]

    def update(self, instance, validated):
        return self.create(validated)


@extend_schema_field(names_of("level"))
class LevelName(StrictCharField):
    """A configured level, by its name (the live schema lists them)."""


class LevelNamesField(serializers.ListField):
    """Level names, as a list; read from and written to the priority class's levels."""

    child = LevelName()

    def to_representation(self, levels):
        return [level.name for level in sorted(levels.all(), key=lambda level: (level.position, level.name))]

    def to_internal_value(self, data):
        names = super().to_internal_value(data)
        levels = {level.name: level for level in Level.objects.all()}
        for i, name in enumerate(names):
            if name not in levels:
                raise serializers.ValidationError({str(i): unknown("level", name, levels)})
        return [levels[name] for name in dict.fromkeys(names)]


class PrioritySerializer(StrictSerializer):
    """A request class that must leave `watermark` x capacity untouched at its levels."""

    name = name_field(PriorityClass)
    watermark = Watermark(required=False, help_text=PriorityClass._meta.get_field("watermark").help_text)
    levels = LevelNamesField(required=False, help_text="Levels it applies at; empty: the global level.")
    version = version_field()

    def validate(self, attrs):
        priority = self.instance or PriorityClass()
        for field in ("name", "watermark"):
            if field in attrs:
                setattr(priority, field, attrs[field])
        full_clean(priority)
        return {"priority": priority, "levels": attrs.get("levels")}

    def create(self, validated):
        priority = validated["priority"]
        priority.save()  # a new version even when only its levels change
        if validated["levels"] is not None:
            priority.levels.set(validated["levels"])
        return priority

    def update(self, instance, validated):
        return self.create(validated)


@extend_schema_field(names_of("tier"))
class NullableTierName(TierName):
    """A tier by its name, or null for none. DRF reads an empty string as null in a nullable
    relation; here it is refused, as the schema says (a name has at least one character)."""

    def run_validation(self, data=serializers.empty):
        if data == "":
            raise serializers.ValidationError("must be a tier's name, or null for none")
        return super().run_validation(data)


class SettingsSerializer(StrictSerializer):
    """The store-wide settings."""

    default_tier = NullableTierName(
        slug_field="name",
        queryset=Tier.objects.all(),
        allow_null=True,
        help_text="The tier of team keys that name no tenant; null: none.",
    )

    def validate(self, attrs):
        settings = self.instance or PolicySettings()  # SettingsView reads the row, or makes one
        if "default_tier" in attrs:
            settings.default_tier = attrs["default_tier"]
        full_clean(settings)
        return {"settings": settings}

    def update(self, instance, validated):
        validated["settings"].save()
        return validated["settings"]
