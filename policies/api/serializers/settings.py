"""The store-wide policy settings on the wire: the default tier."""

from __future__ import annotations

from policies.models import PolicySettings, Tier

from .base import StrictSerializer, full_clean
from .tiers import NullableTierName


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
