"""A tenant (a team key with its tier and optional per-level overrides) on the wire."""

from __future__ import annotations

import datetime as dt

from rest_framework import serializers

from policies.history import replace_rules
from policies.models import Tenant, Tier

from .base import StrictSerializer, full_clean
from .fields import NO_NUL, StrictCharField, version_field
from .rules import RuleMapField, check_rules, merged_rules
from .tiers import TierName


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
