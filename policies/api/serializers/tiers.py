"""A tier (a plan: its rules by level) on the wire, and a tier named by another resource."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from policies.history import replace_rules
from policies.invariants import unknown
from policies.models import Tier

from ..schema_hooks import names_of
from .base import StrictSerializer, full_clean
from .fields import a_string, name_field, version_field
from .rules import RuleMapField, check_rules, merged_rules


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
    """A configured tier, by its name (the live schema lists them). A JSON string only: DRF's
    slug field hands whatever it is sent to the ORM, which reads 1 as the tier '1' and
    recurses into a list (issue 26: a list 468 deep was a RecursionError, a 500)."""

    def to_internal_value(self, data):
        return super().to_internal_value(a_string(data))

    def fail(self, key, **kwargs):
        if key == "does_not_exist":
            known = Tier.objects.values_list("name", flat=True)
            raise serializers.ValidationError(unknown("tier", kwargs["value"], known), code=key)
        super().fail(key, **kwargs)


@extend_schema_field(names_of("tier"))
class NullableTierName(TierName):
    """A tier by its name, or null for none. DRF reads an empty string as null in a nullable
    relation; here it is refused, as the schema says (a name has at least one character)."""

    def run_validation(self, data=serializers.empty):
        if data == "":
            raise serializers.ValidationError("must be a tier's name, or null for none")
        return super().run_validation(data)
