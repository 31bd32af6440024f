"""An alert (a webhook told when a tenant's quota or denied share passes a threshold) on the
wire, and its delivery log.

    {"name": "quota-80", "kind": "quota_used", "threshold": 0.8, "window": null,
     "url": "https://hooks.example.com/limiter", "format": "json", "enabled": true, "version": 1}

`secret` is written, never read: required when creating, kept as it is when a PUT or PATCH
leaves it out. The invariants (policies.invariants, number 12) are the Alert row's own, run
through its `full_clean`; the schema states the same bounds and patterns.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from policies.invariants import (
    ALERT_FORMATS,
    ALERT_KINDS,
    ALERT_WINDOW_PATTERN,
    MAX_SECRET,
    MAX_URL,
    WEBHOOK_URL_PATTERN,
)
from policies.models import Alert

from .base import StrictSerializer, full_clean
from .fields import NO_NUL, StrictCharField, StrictFloatField, name_field, version_field

SECRET_REQUIRED = "this field is required: deliveries are signed with it (HMAC-SHA256)"


@extend_schema_field({"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1})
class Threshold(StrictFloatField):
    """Above 0, at most 1."""


@extend_schema_field({"type": "string", "pattern": f"^(?:{ALERT_WINDOW_PATTERN})$", "nullable": True})
class AlertWindow(StrictCharField):
    """1m to 24h in whole minutes, hours or a day; null (or left out) for a quota_used alert."""


@extend_schema_field({"type": "string", "pattern": f"^(?:{WEBHOOK_URL_PATTERN})$", "maxLength": MAX_URL})
class WebhookURL(StrictCharField):
    """An http:// or https:// URL with a host, in printable ASCII."""


class StrictBooleanField(serializers.BooleanField):
    """true or false only: DRF's BooleanField would take "yes", 1 and "on"."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class AlertSerializer(StrictSerializer):
    """A webhook and what fires it; the secret it signs with is written, never read."""

    kept_on_put = ("secret",)

    name = name_field(Alert)
    kind = serializers.ChoiceField(choices=ALERT_KINDS, help_text=Alert._meta.get_field("kind").help_text)
    threshold = Threshold(help_text=Alert._meta.get_field("threshold").help_text)
    window = AlertWindow(
        required=False, allow_null=True, max_length=16, help_text=Alert._meta.get_field("window").help_text
    )
    url = WebhookURL(max_length=MAX_URL, help_text=Alert._meta.get_field("url").help_text)
    secret = StrictCharField(
        write_only=True,
        required=False,
        min_length=1,
        max_length=MAX_SECRET,
        validators=[NO_NUL],
        help_text="The key deliveries are signed with (HMAC-SHA256, X-Limiter-Signature). Required when "
        "creating; never returned; a PUT or PATCH without it keeps the one stored.",
    )
    format = serializers.ChoiceField(
        choices=ALERT_FORMATS, required=False, help_text=Alert._meta.get_field("format").help_text
    )
    enabled = StrictBooleanField(required=False, help_text=Alert._meta.get_field("enabled").help_text)
    version = version_field()

    @staticmethod
    def request_constraints(method: str) -> dict:
        """A window with a denied_share alert, none with a quota_used one: when creating or
        replacing (a PATCH is merged with the kind stored, so there the server alone can tell)."""
        if method not in ("POST", "PUT"):
            return {}
        # `additionalProperties: true`: each branch ties two fields; the body's own schema
        # refuses unknown fields (policies.api.schema_hooks would otherwise add `false` here).
        return {
            "anyOf": [
                {
                    "properties": {"kind": {"enum": ["quota_used"]}, "window": {"not": {"type": "string"}}},
                    "additionalProperties": True,
                },
                {
                    "properties": {"kind": {"enum": ["denied_share"]}, "window": {"type": "string"}},
                    "required": ["window"],
                    "additionalProperties": True,
                },
            ]
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance is None:
            self.fields["secret"].required = True  # creating: the schema's NewAlertRequest says so too

    def validate(self, attrs):
        alert = self.instance or Alert()
        for field in ("name", "kind", "threshold", "window", "url", "secret", "format", "enabled"):
            if field in attrs:
                setattr(alert, field, "" if attrs[field] is None else attrs[field])
        full_clean(alert)
        return {"alert": alert}

    def create(self, validated):
        validated["alert"].save()
        return validated["alert"]

    def update(self, instance, validated):
        return self.create(validated)

    def to_representation(self, alert):
        body = super().to_representation(alert)
        body["window"] = alert.window or None
        return body


class FiringSerializer(serializers.Serializer):
    """What fired: for whom, which rule (a quota's), the share that passed, the period."""

    tenant = serializers.CharField()
    level = serializers.CharField(allow_null=True, help_text="A quota's level; null for a denied share.")
    rule = serializers.CharField(allow_null=True, help_text="A quota's rule; null for a denied share.")
    threshold = serializers.FloatField()
    value = serializers.FloatField(help_text="The share that passed the threshold.")
    period_start = serializers.IntegerField(allow_null=True, help_text="Epoch seconds; null: a quota with no period.")
    resets_at = serializers.IntegerField(allow_null=True, help_text="Epoch seconds; null: never.")
    state = serializers.ChoiceField(choices=["pending", "delivered", "failed"])
    attempts = serializers.IntegerField()

    def to_representation(self, firing):
        body = super().to_representation(firing)
        body["level"], body["rule"] = firing.level or None, firing.rule or None
        if firing.alert.kind == "quota_used" and firing.period_start <= 0:  # none: credits
            body["period_start"] = None
        return body


class DeliverySerializer(serializers.Serializer):
    """One attempt to deliver an alert (a test's has no firing)."""

    at = serializers.DateTimeField(help_text="When the attempt started.")
    attempt = serializers.IntegerField(help_text="1 for the first attempt of a firing, 2 for its first retry, ...")
    ok = serializers.BooleanField(help_text="The receiver took it: it answered 2xx.")
    status = serializers.IntegerField(allow_null=True, help_text="The receiver's HTTP status; null: no answer.")
    error = serializers.CharField(help_text="Why it failed; empty when it did not.")
    duration = serializers.FloatField(help_text="Seconds the attempt took.")
    test = serializers.BooleanField(help_text="A test delivery (POST .../test, the console's button).")
    firing = FiringSerializer(allow_null=True)
