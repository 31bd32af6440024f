"""Alerts: an operator's webhook, told when a tenant's quota passes a share (`quota_used`) or
its denied share over a window passes one (`denied_share`); each firing, once per tenant,
rule, threshold and period; each attempt to deliver one (the delivery log); and how far into
its quotas each tenant is (for /metrics, without a label per tenant).

An Alert is a policy row: versioned, with its history (without its secret), loaded and
exported with the policy file, and checked by `policies.invariants` (invariant 12) wherever it
is written. Firings and deliveries are what the evaluation (policies.services.alerts) did.

Once per period, across workers and machines, is the database's: a firing is a row unique on
(alert, tenant, level, rule, threshold, period_start), and of the workers that see the same
crossing the one whose insert commits is the one that delivers.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models

from .invariants import (
    ALERT_FORMATS,
    ALERT_KINDS,
    MAX_NAME,
    MAX_SECRET,
    MAX_URL,
    MAX_WINDOW_TEXT,
    NAME_VALIDATOR,
    PolicyViolation,
    check_alert_format,
    check_alert_kind,
    check_alert_secret,
    check_alert_window,
    check_threshold,
    check_webhook_url,
)
from .versioning import PolicyHistory, Versioned

# A rule as a firing names it (`quota(1000/day)`); longer names are cut to the column.
MAX_RULE_NAME = 255
MAX_ERROR = 500


class Alert(Versioned):
    """A webhook and what fires it: a tenant's quota past `threshold` of its limit
    (`quota_used`), or its share of denied decisions over `window` above `threshold`
    (`denied_share`)."""

    name = models.CharField(max_length=MAX_NAME, unique=True, validators=[NAME_VALIDATOR])
    kind = models.CharField(
        max_length=16,
        choices=[(kind, kind) for kind in ALERT_KINDS],
        help_text="quota_used: a tenant's quota passes the threshold share of its limit; "
        "denied_share: a tenant's share of denied decisions over the window is above the threshold.",
    )
    threshold = models.FloatField(help_text="A share above 0 and at most 1: 0.8 is 80%.")
    window = models.CharField(
        max_length=MAX_WINDOW_TEXT,
        blank=True,
        help_text="denied_share only: the span the share is measured over, 1m to 24h (5m, 1h).",
    )
    url = models.CharField(
        "webhook URL", max_length=MAX_URL, help_text="Where deliveries are posted: an http:// or https:// URL."
    )
    # Kept as given: each delivery is signed with it (HMAC-SHA256), so it cannot be a digest.
    # Never shown or returned, and left out of the history (docs/SECURITY.md, What is stored).
    secret = models.CharField(max_length=MAX_SECRET, help_text="Deliveries are signed with it. Never shown again.")
    format = models.CharField(
        max_length=8,
        choices=[(f, f) for f in ALERT_FORMATS],
        default="json",
        help_text="json: the alert's fields; slack: Slack's incoming-webhook form ({\"text\": ...}).",
    )
    enabled = models.BooleanField(default=True, help_text="Off: evaluated no more, delivers nothing.")
    history = PolicyHistory(excluded_fields=["secret"])

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def clean(self):
        errors = {}
        for check, args in (
            (check_alert_kind, (self.kind,)),
            (check_threshold, (self.threshold,)),
            (check_webhook_url, (self.url,)),
            (check_alert_format, (self.format,)),
            (check_alert_secret, (self.secret,)),
        ):
            try:
                check(*args)
            except PolicyViolation as error:
                errors[error.path] = error.reason
        if "kind" not in errors:
            try:
                check_alert_window(self.kind, self.window)
            except PolicyViolation as error:
                errors[error.path] = error.reason
        if errors:
            raise ValidationError(errors)

    @property
    def window_seconds(self) -> int | None:
        """The window in seconds: a denied_share alert's; None for any other kind."""
        return check_alert_window(self.kind, self.window) if self.kind == "denied_share" else None

    def spec(self) -> dict[str, Any]:
        """The alert as the policy file spells it, without its secret."""
        spec: dict[str, Any] = {"kind": self.kind, "threshold": self.threshold}
        if self.window:
            spec["window"] = self.window
        spec["url"] = self.url
        if self.format != "json":
            spec["format"] = self.format
        if not self.enabled:
            spec["enabled"] = False
        return spec


FIRING_STATES = [
    ("pending", "pending: being delivered, or waiting for its next attempt"),
    ("delivered", "delivered"),
    ("failed", "failed: every attempt failed"),
]


class AlertFiring(models.Model):
    """An alert that fired for a tenant: once per (alert, tenant, level, rule, threshold,
    period_start), which the database holds to. `body` is what every attempt sends, byte
    for byte, so that a retry carries the same signature."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="firings")
    tenant = models.CharField(max_length=200)
    # A quota's level and rule; empty for a denied share, which is the tenant's at every level.
    level = models.CharField(max_length=MAX_NAME, blank=True)
    rule = models.CharField(max_length=MAX_RULE_NAME, blank=True)
    threshold = models.FloatField()
    period_start = models.BigIntegerField(help_text="Epoch seconds: the quota's period, or the window's start.")
    resets_at = models.BigIntegerField(null=True, blank=True, help_text="Epoch seconds; empty: never.")
    value = models.FloatField(help_text="The share that passed the threshold.")
    at = models.DateTimeField(db_index=True)
    body = models.TextField(editable=False)
    state = models.CharField(max_length=10, choices=FIRING_STATES, default="pending")
    attempts = models.PositiveIntegerField(default=0)
    next_attempt = models.FloatField(
        default=0.0, help_text="Epoch seconds: when a worker may next try (or take over) the delivery."
    )

    class Meta:
        ordering = ["-at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["alert", "tenant", "level", "rule", "threshold", "period_start"],
                name="alert_fires_once_per_period",
            )
        ]
        indexes = [models.Index(fields=["state", "next_attempt"], name="alert_firing_due")]

    def __str__(self):
        where = f" {self.level}: {self.rule}" if self.rule else ""
        return f"{self.alert_id and self.alert} for {self.tenant}{where} at {self.value:.0%}"


class AlertDelivery(models.Model):
    """One attempt to deliver a firing (or a test, with no firing): when, the receiver's
    HTTP status (none when it never answered), the error, how long it took."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="deliveries")
    firing = models.ForeignKey(AlertFiring, null=True, blank=True, on_delete=models.CASCADE, related_name="deliveries")
    attempt = models.PositiveIntegerField(default=1)
    at = models.DateTimeField(db_index=True)
    status = models.PositiveSmallIntegerField(null=True, blank=True, help_text="The receiver's HTTP status.")
    ok = models.BooleanField(default=False)
    error = models.CharField(max_length=MAX_ERROR, blank=True)
    duration = models.FloatField(default=0.0, help_text="Seconds the attempt took.")

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "alert deliveries"

    def __str__(self):
        return f"{self.alert_id and self.alert} attempt {self.attempt} at {self.at:%Y-%m-%d %H:%M:%S}"

    @property
    def test(self) -> bool:
        return self.firing_id is None


class QuotaBand(models.Model):
    """How far into its quotas a tenant is: the highest share band (80, 90 or 100 percent of
    a limit) any of its quotas reached in its current period, until that period ends. Written
    by the evaluation when a tenant's band changes; read for /metrics'
    `limiter_quota_tenants{band}`, which counts tenants, never names one."""

    tenant = models.CharField(max_length=200, unique=True)
    band = models.PositiveSmallIntegerField(help_text="0, 80, 90 or 100: the percent of a limit reached.")
    until = models.BigIntegerField(null=True, blank=True, help_text="Epoch seconds; empty: no period (credits).")

    def __str__(self):
        return f"{self.tenant} at {self.band}%"


def moment(epoch: float) -> dt.datetime:
    """Epoch seconds as an aware datetime in UTC, as the rows keep times."""
    return dt.datetime.fromtimestamp(epoch, dt.UTC)
