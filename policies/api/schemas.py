"""The API's shapes as DRF serializers, for the OpenAPI schema (drf-spectacular).

The decision endpoints read their bodies with `policies.services.inputs` (fast, strict); these
classes describe the same fields for the schema, and tests check the two agree.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema_field
from rest_framework import serializers

from core.params import LARGEST_NUMBER
from policies.policy import TENANT_LEVEL
from policies.services.inputs import MAX_BATCH, MAX_HOLD, MAX_KEY_LENGTH

from .schema_hooks import keyed_by_level, names_of


class ErrorDetail(serializers.Serializer):
    code = serializers.CharField(help_text="What went wrong, e.g. invalid, not_found, conflict.")
    message = serializers.CharField()
    # The error shape's key. DRF's metaclass takes declared fields out of the class, so this
    # does not hide Serializer.fields at run time; mypy sees the class body only.
    fields = serializers.DictField(  # type: ignore[assignment]
        child=serializers.CharField(), help_text="Dotted field paths, e.g. requests.3.cost, with what is wrong there."
    )


class Error(serializers.Serializer):
    error = ErrorDetail()


ERRORS = {
    400: OpenApiResponse(Error, description="The request names a bad field."),
    401: OpenApiResponse(Error, description="No credentials, or a bad or revoked token."),
    403: OpenApiResponse(Error, description="The credentials lack the scope."),
}
NOT_FOUND = {404: OpenApiResponse(Error, description="No such resource.")}
CONFLICT = {409: OpenApiResponse(Error, description="Changed by someone else, or already settled.")}
UNAVAILABLE = {503: OpenApiResponse(Error, description="The store or the database is unreachable.")}


KEY = {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH}


@extend_schema_field(keyed_by_level(KEY, minProperties=1))
class Keys(serializers.DictField):
    """The key at each level, by configured level name (the live schema lists them)."""

    child = serializers.CharField(min_length=1, max_length=MAX_KEY_LENGTH)


@extend_schema_field(names_of("priority"))
class PriorityName(serializers.CharField):
    """A configured priority class (the live schema lists them)."""


@extend_schema_field({"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": LARGEST_NUMBER})
class Cost(serializers.FloatField):
    """A cost: greater than 0, at most 1e15 (`requests._number`)."""


class DecisionRequest(serializers.Serializer):
    keys = Keys(
        help_text='The key at each level, e.g. {"user": "u1", "team": "acme", "global": "*"}. '
        "Only configured levels; at least one."
    )
    cost = Cost(default=1, help_text="What the request spends, e.g. LLM tokens; greater than 0.")
    priority = PriorityName(required=False, allow_null=True, help_text="A configured priority class; null for none.")
    dry_run = serializers.BooleanField(default=False, help_text="Explain, consuming nothing.")


@extend_schema_field({"type": "boolean", "enum": [False]})
class NoDryRun(serializers.BooleanField):
    """false only: a batch takes no dry runs."""


class BatchItem(DecisionRequest):
    dry_run = NoDryRun(default=False, help_text="false only: a batch takes no dry runs (use /decisions).")


class DecisionFields(serializers.Serializer):
    allowed = serializers.BooleanField()
    retry_after = serializers.FloatField(
        allow_null=True, help_text="Seconds to wait; 0 when allowed; null when it can never fit."
    )
    blocked_by = serializers.CharField(
        allow_null=True, help_text='"level: rule", e.g. "team: token_bucket(100, 10/s)".'
    )
    reason = serializers.CharField(
        help_text="OK, the rule's label, RATE_LIMITED, COST_EXCEEDS_LIMIT or STORE_UNAVAILABLE."
    )
    remaining = serializers.FloatField(allow_null=True, help_text="The tightest rule's room after this decision.")
    degraded = serializers.BooleanField(help_text="Decided by a fail mode: the store was unreachable.")
    shadow_blocked = serializers.ListField(
        child=serializers.CharField(), help_text="Shadow rules that would have denied."
    )
    over_quota = serializers.ListField(
        child=serializers.CharField(),
        help_text="Soft quotas this request went past (it was let go); also in X-Limiter-Over-Quota.",
    )


class RuleFinding(serializers.Serializer):
    level = serializers.CharField()
    key = serializers.CharField()
    rule = serializers.CharField()
    name = serializers.CharField()
    label = serializers.CharField(allow_null=True)  # type: ignore[assignment]  # as `fields` in ErrorDetail
    shadow = serializers.BooleanField()
    wait = serializers.FloatField(allow_null=True)
    remaining = serializers.FloatField(allow_null=True)


class GatewayDecision(DecisionFields):
    lease = serializers.CharField(
        allow_null=True,
        help_text="The concurrency slot this decision holds, when it took one: hand it back with "
        "POST /api/v1/leases/{lease}/release when the work is done (else it comes back when its "
        "lease runs out). null when it holds none.",
    )


class Decision(GatewayDecision):
    dry_run = serializers.BooleanField(required=False)
    rules = RuleFinding(many=True, required=False, help_text="Dry runs only: every rule's wait and room.")


class BatchRequest(serializers.Serializer):
    requests = serializers.ListField(
        child=BatchItem(), min_length=1, max_length=MAX_BATCH, help_text="1 to 1,000 requests, decided in order."
    )


class BatchAnswer(serializers.Serializer):
    decisions = GatewayDecision(many=True)


@extend_schema_field({"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": MAX_HOLD})
class Hold(serializers.FloatField):
    """Seconds: greater than 0, at most a day."""


class ReservationRequest(serializers.Serializer):
    keys = Keys()
    cost = Cost(default=1, help_text="The estimated cost; greater than 0.")
    priority = PriorityName(required=False, allow_null=True, help_text="A configured priority class; null for none.")
    hold = Hold(
        required=False,
        allow_null=True,
        help_text="Seconds until an unsettled reservation expires, greater than 0 (default 60; "
        "at most the shortest concurrency lease).",
    )


class Reservation(DecisionFields):
    id = serializers.CharField(allow_null=True, help_text="null when nothing was reserved.")
    expires_at = serializers.DateTimeField(allow_null=True)
    cost = serializers.FloatField()
    hold = serializers.FloatField(required=False)


class CommitRequest(serializers.Serializer):
    actual_cost = serializers.FloatField(min_value=0, max_value=LARGEST_NUMBER, help_text="0 or more.")


class Settlement(serializers.Serializer):
    id = serializers.CharField()
    status = serializers.ChoiceField(["committed", "cancelled"])
    refunded = serializers.FloatField()
    charged = serializers.FloatField()
    released = serializers.IntegerField()


class LeaseRelease(serializers.Serializer):
    id = serializers.CharField()
    status = serializers.ChoiceField(["released"])
    released = serializers.IntegerField(help_text="How many concurrency rules gave a slot back.")


# --- the operators' read-outs ---------------------------------------------------------------


class RuleCount(serializers.Serializer):
    blocked_by = serializers.CharField(help_text='"level: rule".')
    level = serializers.CharField()
    denied = serializers.IntegerField()


class TenantCount(serializers.Serializer):
    tenant = serializers.CharField(help_text="A team key.")
    denied = serializers.IntegerField(help_text="Its denials at any level: its users', its own and global ones.")


class KeyCount(serializers.Serializer):
    key = serializers.CharField()
    team = serializers.CharField(
        required=False, allow_null=True, help_text="User keys only: the team it was denied in (null: none given)."
    )
    denied = serializers.IntegerField()


class BlockedPoint(serializers.Serializer):
    at = serializers.IntegerField(help_text="Epoch seconds the step starts at.")
    decisions = serializers.IntegerField()
    denied = serializers.IntegerField()
    shadow_denied = serializers.IntegerField()
    over_quota = serializers.IntegerField(help_text="Decisions let go past (or further past) a soft quota.")
    embedded = serializers.IntegerField(
        help_text="Of the decisions, those a Django app made in its own views (policies.embedding)."
    )
    embedded_denied = serializers.IntegerField(help_text="Of the denials, those a Django app made in its own views.")
    blocked_by = serializers.DictField(child=serializers.IntegerField())


class BlockedReport(serializers.Serializer):
    window = serializers.FloatField(help_text="Seconds.")
    since = serializers.IntegerField(help_text="Epoch seconds: the first whole minute read.")
    until = serializers.FloatField(help_text="Epoch seconds: now.")
    decisions = serializers.IntegerField()
    denied = serializers.IntegerField()
    shadow_denied = serializers.IntegerField(help_text="Decisions that a shadow rule would have denied.")
    over_quota = serializers.IntegerField(help_text="Decisions let go past (or further past) a soft quota.")
    embedded = serializers.IntegerField(
        help_text="Of the decisions, those a Django app made in its own views (policies.embedding)."
    )
    embedded_denied = serializers.IntegerField(help_text="Of the denials, those a Django app made in its own views.")
    blocked_by = RuleCount(many=True)
    shadow_blocked_by = RuleCount(many=True, help_text="Would-be denials of each shadow rule.")
    over_quota_by = RuleCount(
        many=True,
        help_text="Each soft quota (`blocked_by`, though it denied nothing) and the decisions it let go past "
        "its limit (`denied`); a decision over two quotas counts for both.",
    )
    top_tenants = TenantCount(many=True)
    top_keys = serializers.DictField(child=KeyCount(many=True), help_text="The most denied keys of each level.")
    series = BlockedPoint(many=True)


class UsagePoint(serializers.Serializer):
    start = serializers.IntegerField(help_text="Epoch seconds the step starts at.")
    decisions = serializers.IntegerField()
    allowed = serializers.IntegerField()
    denied = serializers.IntegerField()
    shadow_denied = serializers.IntegerField(help_text="Decisions that a shadow rule would have denied.")
    over_quota = serializers.IntegerField(help_text="Decisions let go past (or further past) a soft quota.")
    cost = serializers.FloatField(help_text="What the allowed decisions took (e.g. tokens).")


class TopUser(serializers.Serializer):
    user = serializers.CharField()
    decisions = serializers.IntegerField(help_text="At least its denials.")
    denied = serializers.IntegerField()


class TenantUsage(serializers.Serializer):
    tenant = serializers.CharField()
    tier = serializers.CharField(allow_null=True, help_text="The tier it resolved to (null: none).")
    window = serializers.IntegerField(help_text="Seconds.")
    step = serializers.IntegerField(help_text="Seconds per point: 60 or 3600.")
    since = serializers.IntegerField(help_text="Epoch seconds: the first point's start.")
    until = serializers.FloatField(help_text="Epoch seconds: now.")
    breakdown_since = serializers.IntegerField(help_text="Epoch seconds: where blocked_by and top_users start.")
    series = UsagePoint(many=True)
    blocked_by = serializers.DictField(child=serializers.IntegerField(), help_text='"level: rule" -> denials.')
    shadow_blocked_by = serializers.DictField(
        child=serializers.IntegerField(), help_text='"level: rule" -> would-be denials of a shadow rule.'
    )
    over_quota_by = serializers.DictField(
        child=serializers.IntegerField(), help_text='"level: rule" -> decisions let go past a soft quota.'
    )
    top_users = TopUser(many=True)


class TenantQuota(serializers.Serializer):
    level = serializers.CharField()
    rule = serializers.CharField(help_text="The quota as blocked_by names it, without its level.")
    # A quota's label; DRF's metaclass takes declared fields out of the class, so this does not
    # hide Field.label at run time (as ErrorDetail's `fields`); mypy sees the class body only.
    label = serializers.CharField(allow_null=True)  # type: ignore[assignment]
    mode = serializers.ChoiceField(choices=["hard", "soft"])
    period = serializers.ChoiceField(choices=["hour", "day", "week", "month", "none"])
    timezone = serializers.CharField(help_text="The IANA time zone its periods follow.")
    limit = serializers.FloatField()
    used = serializers.FloatField(help_text="Taken in the current period; past the limit after an overspend.")
    remaining = serializers.FloatField(help_text="limit - used: negative after an overspend.")
    period_start = serializers.DateTimeField(allow_null=True, help_text="In the quota's time zone; null: credits.")
    resets_at = serializers.DateTimeField(allow_null=True, help_text="The next period's start; null: credits.")
    projected_exhaustion = serializers.DateTimeField(
        allow_null=True, help_text="When it runs out at the current period's pace so far; null: not this period."
    )


class TenantQuotas(serializers.Serializer):
    tenant = serializers.CharField()
    quotas = TenantQuota(many=True)


@extend_schema_field({"type": "string", "enum": [TENANT_LEVEL]})
class CreditsLevel(serializers.CharField):
    """A tenant's credits are at the tenant's level."""


@extend_schema_field(
    {"oneOf": [{"type": "string", "minLength": 1, "maxLength": 64}, {"type": "integer", "minimum": 0}]}
)
class RuleRef(serializers.JSONField):
    """A rule named by its label, or by its index among the level's rules."""


@extend_schema_field({"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": LARGEST_NUMBER})
class Credits(serializers.FloatField):
    """More than 0."""


class CreditsRequest(serializers.Serializer):
    level = CreditsLevel(help_text="The level of the credits: the tenant's (team).")
    rule = RuleRef(help_text="The quota's label, or its index among the level's rules.")
    add = Credits(help_text="Credits to add: more than 0.")


class CreditsAnswer(serializers.Serializer):
    tenant = serializers.CharField()
    level = serializers.CharField()
    rule = serializers.CharField()
    added = serializers.FloatField()
    balance = serializers.FloatField(allow_null=True, help_text="What is left after the top-up.")
