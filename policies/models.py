"""The policy store: levels, tiers, tenants, the rules they carry, priority classes (and the
alerts, whose models are in policies.alerts).

Rows are turned into limiters in one place, `policies.compile`. A row's validation calls the
policy's invariants (`policies.invariants`), which reuse the engine's own declarations
(core.RULES, core.Param, core.config): a rule type's parameters are stated once, in core.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from core import RULES
from core.config import FAIL_MODES

from .alerts import Alert, AlertDelivery, AlertFiring, QuotaBand
from .invariants import (
    MAX_LABEL,
    MAX_NAME,
    MAX_RULE_TYPE,
    NAME_VALIDATOR,
    SPEC_FIELDS,
    PolicyViolation,
    check_fail_mode,
    check_rule,
    check_watermark,
)
from .versioning import AtPolicyVersion, PolicyHistory, StaleVersion, Versioned, versioned_save

# Re-exported: the policy's writers catch StaleVersion, signals listen to versioned_save, and
# Django finds the app's models here (the alerts' are a topic of their own: policies.alerts).
__all__ = [
    "Alert",
    "AlertDelivery",
    "AlertFiring",
    "PolicyHistory",
    "QuotaBand",
    "StaleVersion",
    "Versioned",
    "versioned_save",
]

COUNTS_CHOICES = [("cost", "cost"), ("requests", "requests (1 per request)")]


def rule_type_choices():
    """The rule types the engine knows: derived from core.RULES, never typed twice."""
    return [(name, name) for name in sorted(RULES)]


class RulesAtVersion(AtPolicyVersion):
    """What a tier's or tenant's history record keeps beyond the other records: the rules
    it had at that version (`policies.history`), so that reverting to it can put them back."""

    rules = models.JSONField(
        null=True,
        blank=True,
        editable=False,
        help_text="Its rule rows at this version: level (id), position, type, params, label, shadow, "
        "counts. Empty (null) in records made before rules were kept with each version.",
    )

    class Meta:
        abstract = True


class Level(Versioned):
    """A named scope, in evaluation order, with what it does while the store is down."""

    name = models.CharField(max_length=MAX_NAME, unique=True, validators=[NAME_VALIDATOR])
    position = models.PositiveIntegerField(default=0, help_text="Evaluation order: lower first.")
    fail_mode = models.CharField(
        max_length=8,
        choices=[(m, m) for m in FAIL_MODES],
        default="open",
        help_text="While the store is unreachable: allow (open), deny (closed), "
        "or decide in process at the fallback fraction (local).",
    )
    fallback_fraction = models.FloatField(
        default=0.25, help_text="Share of the limits the local fallback allows (0 < f <= 1)."
    )
    history = PolicyHistory()

    class Meta:
        ordering = ["position", "name"]

    def __str__(self):
        return self.name

    def clean(self):
        try:
            check_fail_mode(self.fail_mode, self.fallback_fraction)
        except PolicyViolation as error:
            raise ValidationError({error.path: error.reason}) from None


class Tier(Versioned):
    """A plan (free, pro, ...): rules for each level."""

    name = models.CharField(max_length=MAX_NAME, unique=True, validators=[NAME_VALIDATOR])
    history = PolicyHistory(bases=[RulesAtVersion])

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class Tenant(Versioned):
    """A team key with a tier, and optional per-level overrides (rules owned by the tenant)
    that replace the tier's rules at their level while `overrides_until` is in the future."""

    key = models.CharField(max_length=200, unique=True, help_text="The team key requests carry.")
    tier = models.ForeignKey(Tier, on_delete=models.PROTECT, related_name="tenants")
    overrides_until = models.DateTimeField(
        null=True, blank=True, help_text="Overrides stop applying at this time; empty: never."
    )
    history = PolicyHistory(bases=[RulesAtVersion])

    class Meta:
        ordering = ["key"]

    def __str__(self):
        return self.key

    def clean(self):
        if self.tier_id is not None and not Tier.objects.filter(pk=self.tier_id).exists():
            raise ValidationError({"tier": "This tier no longer exists."})


class Rule(models.Model):
    """One rule at one level. Its owner is a tier, a tenant (an override), or neither (global)."""

    tier = models.ForeignKey(Tier, null=True, blank=True, on_delete=models.CASCADE, related_name="rules")
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="rules")
    level = models.ForeignKey(Level, on_delete=models.PROTECT, related_name="rules")
    type = models.CharField(max_length=MAX_RULE_TYPE, choices=rule_type_choices)
    params = models.JSONField(
        default=dict, blank=True, help_text='The rule type\'s parameters, e.g. {"capacity": 100, "per_second": 10}.'
    )
    label = models.CharField(
        max_length=MAX_LABEL, blank=True, help_text="Reason code a denial reports, e.g. RPM_LIMIT."
    )
    shadow = models.BooleanField(default=False, help_text="Evaluated and counted, never denies.")
    counts = models.CharField(max_length=8, choices=COUNTS_CHOICES, default="cost")
    position = models.PositiveIntegerField(default=0)
    history = PolicyHistory()

    class Meta:
        ordering = ["level__position", "position", "id"]
        constraints = [
            models.CheckConstraint(
                condition=~(Q(tier__isnull=False) & Q(tenant__isnull=False)), name="rule_has_at_most_one_owner"
            ),
        ]

    def __str__(self):
        owner = self.tier or self.tenant or "global"
        return f"{owner} {self.level_id and self.level}: {self.type}"

    @property
    def owner(self):
        return self.tier or self.tenant

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], **fields: Any) -> Rule:
        """A row holding `spec`, a rule as the policy file spells it; `fields` are its owner,
        level and position. The inverse of `spec()`."""
        return cls(
            type=spec["type"],
            label=spec.get("label") or "",
            shadow=spec.get("shadow", False),
            counts=spec.get("counts", "cost"),
            params={k: v for k, v in spec.items() if k not in SPEC_FIELDS},
            **fields,
        )

    def spec(self) -> dict:
        """The rule as the engine's config spells it."""
        spec = {"type": self.type, **(self.params or {})}
        if self.label:
            spec["label"] = self.label
        if self.shadow:
            spec["shadow"] = True
        if self.counts != "cost":
            spec["counts"] = self.counts
        return spec

    def clean(self):
        if self.tier_id is not None and self.tenant_id is not None:
            raise ValidationError("A rule belongs to a tier, a tenant, or neither (global), never both.")
        if not isinstance(self.params, dict):
            raise ValidationError({"params": "Must be a mapping of parameter names to values."})
        try:
            check_rule(self.spec())
        except PolicyViolation as error:
            # A parameter's error lands on `params`, naming the parameter.
            field = error.path.split(".", 1)[0]
            if field in SPEC_FIELDS:
                raise ValidationError({field: error.reason}) from None
            raise ValidationError({"params": str(error)}) from None


def rule_specs(rules: Iterable[Rule]) -> dict[str, list[dict]]:
    """Rule rows (ordered by level, then position) as specs by level name, as the policy file
    spells them."""
    out: dict[str, list[dict]] = {}
    for rule in rules:
        out.setdefault(rule.level.name, []).append(rule.spec())
    return out


class PriorityClass(Versioned):
    """A request class that must leave `watermark` x capacity untouched at its levels."""

    name = models.CharField(max_length=MAX_NAME, unique=True, validators=[NAME_VALIDATOR])
    watermark = models.FloatField(
        default=0.0,
        validators=[MinValueValidator(0.0)],
        help_text="Share of each rule's capacity this class must leave (0 up to 1).",
    )
    levels = models.ManyToManyField(
        Level,
        blank=True,
        related_name="priority_classes",
        help_text="Levels it applies at; empty means the global level.",
    )
    history = PolicyHistory(m2m_fields=[levels])

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "priority classes"

    def __str__(self):
        return self.name

    def clean(self):
        try:
            check_watermark(self.watermark)
        except PolicyViolation as error:
            raise ValidationError({"watermark": error.reason}) from None


class PolicySettings(models.Model):
    """The singleton of store-wide settings."""

    default_tier = models.ForeignKey(
        Tier,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The tier of team keys that name no tenant.",
    )
    history = PolicyHistory()

    class Meta:
        verbose_name = verbose_name_plural = "policy settings"

    def __str__(self):
        return "policy settings"

    def save(self, *args, **kwargs):
        self.pk = 1
        super().save(*args, **kwargs)

    @classmethod
    def load(cls) -> PolicySettings:
        return cls.objects.get_or_create(pk=1)[0]


class PolicyVersion(models.Model):
    """One row, bumped after every committed policy change; workers poll it to reload."""

    number = models.BigIntegerField(default=0)
    # A random token of the transaction whose bump made `number` (signals.py): a later write
    # of that transaction finds it and bumps no more; a rollback of the bump takes it away.
    bumped_by = models.CharField(max_length=32, default="", editable=False)

    class Meta:
        verbose_name = "policy version counter"

    def __str__(self):
        return f"policy version {self.number}"


class PolicyChange(models.Model):
    """A policy version: when it was made and by whom, written by the bump that made it, in
    the same transaction. What it changed is in the history records that carry its number
    (`policy_version`), worded by `policies.changes`."""

    version = models.PositiveBigIntegerField(db_index=True)
    at = models.DateTimeField("when", default=timezone.now)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    by = models.CharField(
        "author",
        max_length=150,
        blank=True,
        help_text="Who made it: the operator's name, a service token (token:<name>) or a command "
        "(loadpolicies <file>); empty when no one could be told.",
    )

    class Meta:
        ordering = ["-version", "-id"]
        verbose_name = "policy version"
        verbose_name_plural = "policy versions"

    def __str__(self):
        return f"version {self.version}"


TOKEN_SCOPES = [
    ("decide", "decide: decisions, batches and reservations"),
    ("admin", "admin: everything, policy changes included"),
]


class ServiceToken(models.Model):
    """A credential for a gateway or script. Only a digest of the secret is kept: the token
    is shown once, when it is made, and a database dump holds nothing that authenticates.

    Tokens are random (256 bits), so a fast SHA-256 is as strong as a slow password hash
    would be; `prefix` (the token's first characters, not secret) finds the row."""

    name = models.CharField(max_length=100, help_text="Who uses it, e.g. the gateway's name.")
    scope = models.CharField(max_length=8, choices=TOKEN_SCOPES, default="decide")
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    digest = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(
        null=True, blank=True, help_text="Set to revoke: the token stops working within seconds."
    )

    class Meta:
        ordering = ["name", "id"]

    def __str__(self):
        return f"{self.name} ({self.scope}, {self.prefix}…)"

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


class CreditTopUp(models.Model):
    """Credits added to a tenant's balance (a quota with `period: none`): who, how much, and
    the balance after. A top-up is no change of the policy (it bumps no version): the credits
    are state in the store, and this is their ledger."""

    tenant_key = models.CharField(max_length=200, db_index=True)
    level = models.CharField(max_length=64)
    rule = models.CharField(max_length=500, help_text="The quota as blocked_by names it, without its level.")
    amount = models.FloatField()
    balance = models.FloatField(null=True, blank=True, help_text="What was left after it.")
    at = models.DateTimeField("when", default=timezone.now, db_index=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    by = models.CharField(
        "author", max_length=150, blank=True, help_text="The operator's name, or a service token (token:<name>)."
    )

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name = "credit top-up"

    def __str__(self):
        return f"{self.tenant_key}: +{self.amount:g} ({self.rule})"
