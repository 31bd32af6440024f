"""POST /api/v1/whatif: recent traffic replayed under a draft policy (policies.whatif)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from core import ConfigError
from policies.services.errors import Conflict, ServiceError, invalid
from policies.services.whatif import parse_what_if, what_if

from . import schemas, whatif_schemas
from .auth import IsOperator


def refused(error: ConfigError) -> ServiceError:
    """A refused draft, as `loadpolicies` refuses a file, its path under `policy`: a 409 when
    it clashes with what is stored (a rule repeating another), else a 400."""
    field = f"policy.{error.path}" if error.path else "policy"
    if getattr(error, "conflict", False):
        return Conflict(error.reason, field)
    return invalid(field, error.reason)


class WhatIfView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        request=whatif_schemas.WhatIfRequest,
        responses={200: whatif_schemas.WhatIfAnswer, **schemas.ERRORS, **schemas.CONFLICT, **schemas.UNAVAILABLE},
        tags=["observe"],
        summary="What if: recent traffic replayed under a draft policy",
        description="Replays the decision requests recorded in the window (LIMITER_RECORD_LIMIT keeps the "
        "latest 200,000) twice, each from full buckets at the window's start: under the current policy "
        "and under the draft laid over it. Per tenant (most newly denied first), in all, and over time. "
        "Nothing is saved. A bad draft is refused as `loadpolicies` refuses a file, at its path under "
        "`policy` (409 when a rule repeats another, or the draft leaves a stored tier no rule). An empty "
        "window answers zeros.",
    )
    def post(self, request):
        draft, window, top = parse_what_if(request.data)
        try:
            return Response(what_if(draft, window, top))
        except ConfigError as error:
            raise refused(error) from None
