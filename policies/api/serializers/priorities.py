"""A priority class (a request class that leaves a watermark of capacity to others) on the
wire."""

from __future__ import annotations

from policies.models import PriorityClass

from .base import StrictSerializer, full_clean
from .fields import Watermark, name_field, version_field
from .levels import LevelNamesField


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
