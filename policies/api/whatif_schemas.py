"""The what-if's shapes as DRF serializers, for the OpenAPI schema (drf-spectacular).

A draft is read by policies.services.whatif with the policy file's own checks; these classes only
describe its shape, keyed by the names configured now (schema_hooks.keyed_by), and the answer.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.config import FAIL_MODES
from policies.models import Level
from policies.services.usage import WINDOW_PATTERN
from policies.services.whatif import MAX_TOP_TENANTS

from .schema_hooks import keyed_by, names_of
from .serializers.fields import FallbackFraction, Watermark, name_field
from .serializers.levels import LevelName
from .serializers.rules import RuleMapExtension, RuleMapField

# A level's, tier's or priority class's name (policies.invariants.NAME_VALIDATOR), as a schema pattern.
NAME_PATTERN = "^[A-Za-z0-9_.:-]+$"


class DraftLevelSpec(serializers.Serializer):
    name = name_field(Level)
    fail_mode = serializers.ChoiceField(FAIL_MODES, required=False, help_text="Default: open.")
    fallback_fraction = FallbackFraction(required=False, help_text="For fail mode local; default 0.25.")


@extend_schema_field(names_of("tier"))
class DraftTierName(serializers.CharField):
    """A configured tier, by its name."""


class DraftRules(RuleMapField):
    """Rule specs by level as the policy file spells them: a list for each level given."""


class DraftRulesExtension(OpenApiSerializerFieldExtension):
    """RuleMapField's schema, but a level's rules are a list, never null (as in a policy file)."""

    target_class = DraftRules

    def map_serializer_field(self, auto_schema, direction):
        schema = RuleMapExtension(self.target).map_serializer_field(auto_schema, direction)
        schema["additionalProperties"] = {k: v for k, v in schema["additionalProperties"].items() if k != "nullable"}
        return schema


class DraftTenant(serializers.Serializer):
    tier = DraftTierName(required=False, help_text="Default: its tier now; for a new tenant the default tier.")
    overrides = DraftRules(
        required=False,
        allow_null=True,
        help_text="Each level given replaces its overrides there ([] removes them); null removes them all.",
    )
    overrides_until = serializers.DateTimeField(required=False, allow_null=True, help_text="null: never.")


class DraftPriority(serializers.Serializer):
    watermark = Watermark(required=False, help_text="Default 0.")
    levels = serializers.ListField(child=LevelName(), required=False, help_text="Default: the global level.")


class DraftField(serializers.JSONField):
    """A part of a draft, described by DraftFieldExtension: `shape` is "levels" (each by
    name, or with its fail mode), "global" (rule specs as a list or by level), or a kind of
    name ("tier", "tenant", "priority") that keys an object of `value`s."""

    def __init__(self, shape: str, value: Any = None, **kwargs) -> None:
        self.shape, self.value = shape, value
        super().__init__(**kwargs)


class DraftFieldExtension(OpenApiSerializerFieldExtension):
    target_class = DraftField

    def map_serializer_field(self, auto_schema, direction):
        shape, value = self.target.shape, self.target.value
        if shape == "levels":
            spec = auto_schema.resolve_serializer(DraftLevelSpec, direction).ref
            level = {"oneOf": [{"type": "string", "pattern": NAME_PATTERN, "maxLength": 64}, spec]}
            # Names are unique too, which a schema cannot say of a list.
            return {"type": "array", "items": level, "minItems": 1, "uniqueItems": True}
        rules = DraftRulesExtension(DraftRules()).map_serializer_field(auto_schema, direction)
        if shape == "global":
            return {"oneOf": [{"type": "array", "items": rules["additionalProperties"]["items"]}, rules]}
        if value is DraftRules:
            schema = keyed_by(shape, rules)
        else:
            each = auto_schema.resolve_serializer(value, direction).ref
            # A tenant given as null is one with every field as it is (a new one: the default tier).
            schema = keyed_by(shape, {"allOf": [each], "nullable": True} if shape == "tenant" else each)
        return {**schema, "nullable": True} if self.target.allow_null else schema


class PolicyDraft(serializers.Serializer):
    """A policy document in the `loadpolicies` format, whole or partial."""

    default_tier = DraftTierName(required=False, allow_null=True, help_text="null: none.")
    levels = DraftField("levels", required=False, help_text="Each level given replaces it; new ones go last.")
    tiers = DraftField(
        "tier",
        DraftRules,
        required=False,
        help_text="Each level a tier gives replaces its rules there ([] removes them).",
    )
    tenants = DraftField("tenant", DraftTenant, required=False, help_text="Each field a tenant gives replaces its own.")
    priorities = DraftField(
        "priority",
        DraftPriority,
        required=False,
        allow_null=True,
        help_text="Each priority class given replaces it; null: none given.",
    )

    def get_fields(self):
        fields = super().get_fields()
        # `global` is a Python keyword, so it cannot be declared as a class attribute.
        fields["global"] = DraftField("global", required=False, help_text="Replaces the global rules when given.")
        return {name: fields[name] for name in ("default_tier", "levels", "tiers", "global", "tenants", "priorities")}


@extend_schema_field({"type": "string", "pattern": f"^(?:{WINDOW_PATTERN})$"})
class Window(serializers.CharField):
    """A duration of 1s to 24h (inspection.parse_window reads it with the same pattern)."""


class WhatIfRequest(serializers.Serializer):
    policy = PolicyDraft(
        allow_null=True,
        help_text="The draft: a policy document as `loadpolicies` reads it, whole or partial, laid over the "
        "current policy: only the tiers, tenants, levels and priority classes it gives change. null or {}: "
        "no change (an empty policy file reads as null).",
    )
    window = Window(required=False, help_text="How far back to replay: 1s to 24h, like 300, 5m or 1h (default 1h).")
    top = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_TOP_TENANTS, help_text="Tenants listed (default 100)."
    )


class WhatIfWindow(serializers.Serializer):
    start = serializers.FloatField(help_text="Epoch seconds.")
    end = serializers.FloatField(help_text="Epoch seconds: now.")


class WhatIfCounts(serializers.Serializer):
    decisions = serializers.IntegerField(help_text="Recorded decisions and reservations replayed.")
    allowed_now = serializers.IntegerField(help_text="Allowed under the current policy.")
    allowed_draft = serializers.IntegerField(help_text="Allowed under the draft.")
    newly_denied = serializers.IntegerField(help_text="Allowed now, denied under the draft.")
    newly_allowed = serializers.IntegerField(help_text="Denied now, allowed under the draft.")
    blocked_by_draft = serializers.DictField(
        child=serializers.IntegerField(), help_text='The draft\'s denials by blocked_by ("level: rule").'
    )


class WhatIfTenant(WhatIfCounts):
    tenant = serializers.CharField(help_text="A team key.")
    tier_now = serializers.CharField(allow_null=True, help_text="The tier it resolves to now (null: none).")
    tier_draft = serializers.CharField(allow_null=True, help_text="The tier it resolves to under the draft.")


class WhatIfTotals(WhatIfCounts):
    blocked_by_now = serializers.DictField(
        child=serializers.IntegerField(), help_text="The current policy's denials by blocked_by."
    )


class WhatIfPoint(serializers.Serializer):
    start = serializers.FloatField(help_text="Epoch seconds the step starts at.")
    decisions = serializers.IntegerField()
    denied_now = serializers.IntegerField()
    denied_draft = serializers.IntegerField()


class WhatIfAnswer(serializers.Serializer):
    window = WhatIfWindow()
    step = serializers.IntegerField(help_text="Seconds per point of the series.")
    recording = serializers.BooleanField(help_text="false: LIMITER_RECORD_LIMIT is 0, nothing was recorded.")
    replayed = serializers.IntegerField(help_text="Records replayed under each policy (settlements included).")
    tenants = WhatIfTenant(many=True, help_text="Sorted by newly_denied, most first; the `top` first.")
    tenants_total = serializers.IntegerField(help_text="Tenants with recorded decisions in the window.")
    totals = WhatIfTotals(help_text="Every decision of the window, of every tenant and none.")
    series = WhatIfPoint(many=True, help_text="Denials over time under each policy.")
