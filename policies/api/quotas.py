"""A tenant's budgets over REST: GET /api/v1/tenants/{key}/quotas and
POST /api/v1/tenants/{key}/credits (policies.services.quotas computes both)."""

from __future__ import annotations

import datetime as dt
from typing import Any
from zoneinfo import ZoneInfo

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from policies.services.inputs import MAX_KEY_LENGTH
from policies.services.quotas import parse_top_up, tenant_quotas, top_up

from . import schemas
from .auth import IsOperator

KEY = OpenApiParameter(
    "key",
    {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH},
    OpenApiParameter.PATH,
    description="The tenant's team key.",
)


def iso(epoch: float | None, zone: str) -> str | None:
    """A moment in ISO 8601 with the offset of the quota's time zone; None stays null."""
    if epoch is None:
        return None
    return dt.datetime.fromtimestamp(epoch, ZoneInfo(zone)).isoformat()


def quota_body(quota: dict[str, Any]) -> dict[str, Any]:
    zone = quota["timezone"]
    return {
        **{name: quota[name] for name in ("level", "rule", "label", "mode", "period", "timezone")},
        "limit": quota["limit"],
        "used": quota["used"],
        "remaining": quota["remaining"],
        "period_start": iso(quota["period_start"], zone),
        "resets_at": iso(quota["resets_at"], zone),
        "projected_exhaustion": iso(quota["projected_exhaustion"], zone),
    }


class TenantQuotasView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        parameters=[KEY],
        responses={200: schemas.TenantQuotas, **schemas.ERRORS, **schemas.NOT_FOUND, **schemas.UNAVAILABLE},
        tags=["observe"],
        summary="A tenant's quotas: used, remaining, when they reset and run out",
        description="Every quota rule at the tenant's level (its tier's, or its override's), read live: "
        "used in the current period, remaining (negative after an overspend), the period's start and "
        "the next one's in the quota's own time zone, and when it runs out at the pace of the period so "
        "far (null when it would not this period). A team key with no tenant row has its default tier's.",
    )
    def get(self, request, key):
        return Response({"tenant": key, "quotas": [quota_body(q) for q in tenant_quotas(key)]})


class TenantCreditsView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        parameters=[KEY],
        request=schemas.CreditsRequest,
        responses={
            200: schemas.CreditsAnswer,
            **schemas.ERRORS,
            **schemas.NOT_FOUND,
            **schemas.CONFLICT,
            **schemas.UNAVAILABLE,
        },
        tags=["policy"],
        summary="Top up a tenant's credits",
        description="Adds `add` to the balance of a quota with `period: none` (credits never reset by "
        "themselves), named by its label or its index among the level's rules. Recorded with who did it and "
        "how much. A rule that is no balance of credits is a 409; no such rule, a 404.",
    )
    def post(self, request, key):
        level, rule, amount = parse_top_up(request.data)
        user = request.user if getattr(request.user, "pk", None) is not None else None
        return Response(top_up(key, level, rule, amount, by=str(request.user), user=user))
