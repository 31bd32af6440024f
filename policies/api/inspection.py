"""The operators' read-outs over REST: a key's live buckets, who is being throttled by what,
and a tenant's usage over time (policies.services.inspection and .usage compute them)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from policies.services.errors import invalid
from policies.services.inputs import MAX_KEY_LENGTH
from policies.services.inspection import bucket_report
from policies.services.usage import (
    MAX_TOP,
    USAGE_HOURS,
    USAGE_MINUTES,
    USAGE_STEPS,
    USAGE_WINDOW_PATTERN,
    WINDOW_PATTERN,
    blocked_report,
    duration_text,
    parse_top,
    parse_usage_query,
    parse_window,
    tenant_usage,
)

from . import schemas
from .auth import IsOperator
from .schema_hooks import names_of


class BucketsView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        parameters=[
            OpenApiParameter("level", names_of("level"), required=True, description="A configured level."),
            OpenApiParameter(
                "key",
                {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH},
                required=True,
                description="The key at that level.",
            ),
            OpenApiParameter(
                "team", str, description="For user keys: the team whose tier applies (default: the default tier)."
            ),
        ],
        responses={200: OpenApiTypes.OBJECT, **schemas.ERRORS},
        tags=["observe"],
        summary="The live state of every rule for a key",
    )
    def get(self, request):
        query = request.query_params
        for required in ("level", "key"):
            if not query.get(required):
                raise invalid(required, "this query parameter is required")
        team = query.get("team") or None
        return Response(bucket_report(query["level"], query["key"], team))


class BlockedStatsView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "window",
                {"type": "string", "pattern": f"^(?:{WINDOW_PATTERN})$"},
                description="1s to 24h: 5m, 1h, 24h or seconds (default 1h).",
            ),
            OpenApiParameter(
                "top",
                {"type": "integer", "minimum": 1, "maximum": MAX_TOP},
                description=f"Most throttled keys per level (1-{MAX_TOP}, default 10).",
            ),
        ],
        responses={200: schemas.BlockedReport, **schemas.ERRORS, **schemas.UNAVAILABLE},
        tags=["observe"],
        summary="Denials by blocked_by, and the most throttled tenants and keys",
        description="Denials, shadow rules' would-be denials and decisions let go past a soft quota by rule, "
        "the tenants with the most denials at any level (`top_tenants`), and the most denied keys of each level "
        "(a user with its team).",
    )
    def get(self, request):
        window = parse_window(request.query_params.get("window", "1h"))
        top = parse_top(request.query_params.get("top", "10"))
        return Response(blocked_report(window, top))


class TenantUsageView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        parameters=[
            OpenApiParameter("key", str, OpenApiParameter.PATH, description="The tenant's team key."),
            OpenApiParameter(
                "window",
                {"type": "string", "pattern": f"^(?:{USAGE_WINDOW_PATTERN})$"},
                description=f"1s to {duration_text(USAGE_HOURS)}, e.g. 1h, 24h, 30d (default 24h); with step 1m "
                f"the series covers the last {duration_text(USAGE_MINUTES)} at most (the minutes kept).",
            ),
            OpenApiParameter(
                "step",
                {"type": "string", "enum": list(USAGE_STEPS)},
                description="1m or 1h per point (default: 1m when the window fits the minutes kept, else 1h).",
            ),
        ],
        responses={200: schemas.TenantUsage, **schemas.ERRORS, **schemas.NOT_FOUND, **schemas.UNAVAILABLE},
        tags=["observe"],
        summary="A tenant's decisions, denials, shadow denials and cost over time",
        description="One point per step: decisions, allowed, denied, shadow_denied, over_quota and cost taken "
        "(epoch `start`). `blocked_by`, `shadow_blocked_by`, `over_quota_by` and `top_users` cover the whole "
        "hours the window touches, from `breakdown_since` (users: the minutes kept at most). 404: no such "
        "tenant and no traffic of that team key in the window.",
    )
    def get(self, request, key):
        window, step = parse_usage_query(request.query_params)
        return Response(tenant_usage(key, window, step))
