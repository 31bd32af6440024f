"""A tier's or tenant's rules on the wire: rule specs by level name (RuleMapField), where a
violation of the policy's invariants is and whether it is a 400 or a 409 (`refusal`), and
their schema, a component per registered rule type (RuleMapExtension)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import ResolvedComponent
from rest_framework import serializers

from core import RULES
from policies.integrity import check_owner
from policies.invariants import PolicyViolation, check_rule, unknown
from policies.models import Level, Rule, rule_specs
from policies.services.errors import conflict

from ..schema_hooks import keyed_by_level, names_of

# Where an error is ----------------------------------------------------------------------


def engine_path(path: str) -> str:
    """The engine's `user[1].capacity` as the API's dotted `user.1.capacity`."""
    return re.sub(r"\[(\d+)\]", r".\1", path).strip(".")


def refusal(error: PolicyViolation, field: str) -> Exception:
    """A violation of a policy invariant as the API answers it: a 409 for a conflict with what
    is stored, else a 400; either names `field` and the violation's path below it."""
    path = ".".join(part for part in (field, engine_path(error.path)) if part)
    if error.conflict:
        return conflict(error.reason, path)
    return serializers.ValidationError({path or "non_field_errors": error.reason})


# Rules by level --------------------------------------------------------------------------


class RuleMapField(serializers.Field):
    """Rule specs by level name. Reads as `{level: [spec, ...]}`, each spec checked on its
    own (`check_rule`); a level given `null` or `[]` has no rules (on PATCH: its rules are
    removed). The owner's serializer checks them together (`check_owner`).

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
        check_owner(kind, rules)
    except PolicyViolation as error:
        raise refusal(error, field) from None


# Their schema ------------------------------------------------------------------------------


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
            **{param.name: _param_schema(param) for param in params},
            "label": {
                "type": "string",
                "nullable": True,
                "pattern": LABEL_PATTERN,
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


def _param_schema(param) -> dict:
    """A parameter's schema; one that names a configured thing lists the names (schema_hooks)."""
    schema = _openapi_30(param.schema())
    if param.names:
        schema.update({k: v for k, v in names_of(param.names).items() if k != "type"})
    return schema


# A label holds no NUL (core.rules refuses it) and some character that Python's str.strip()
# keeps (the engine refuses a blank label). The blanks are spelled out, since a pattern's \s is
# not Python's (no \x1c-\x1f or \x85, but \ufeff).
BLANKS = r"\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
LABEL_PATTERN = rf"^[^\x00]*[^\x00{BLANKS}][^\x00]*$"


def _openapi_30(schema: dict) -> dict:
    """A Param's JSON-schema fragment as OpenAPI 3.0 spells it (a boolean exclusiveMinimum; an
    optional value's `type: [..., "null"]` as `nullable`)."""
    out = {k: list(v) if isinstance(v, tuple) else v for k, v in schema.items()}
    if "exclusiveMinimum" in out:
        out["minimum"], out["exclusiveMinimum"] = out["exclusiveMinimum"], True
    if isinstance(out.get("type"), list):
        out["type"], out["nullable"] = next(kind for kind in out["type"] if kind != "null"), True
    return out
