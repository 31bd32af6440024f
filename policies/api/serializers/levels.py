"""A level (a named scope, in evaluation order, with its fail mode) on the wire, and levels
named by another resource."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.config import FAIL_MODES
from policies.invariants import unknown
from policies.models import Level

from ..schema_hooks import names_of
from .base import StrictSerializer, full_clean
from .fields import FallbackFraction, StrictCharField, StrictIntegerField, largest, name_field, version_field


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
