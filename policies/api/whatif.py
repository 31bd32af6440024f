"""POST /api/v1/whatif: recent traffic replayed under a draft policy (policies.whatif)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from core import ConfigError

from ..whatif import MAX_TOP_TENANTS, TOP_TENANTS, what_if
from . import schemas, whatif_schemas
from .auth import IsOperator
from .errors import APIError, invalid
from .inspection import parse_window

FIELDS = ("policy", "window", "top")


def parse_what_if(data: Any) -> tuple[Any, int, int]:
    """(draft, window in seconds, top) from the request's body; a 400 naming the field else."""
    if not isinstance(data, dict):
        raise invalid("", "the body must be a JSON object")
    for name in data:
        if name not in FIELDS:
            raise invalid(name, f"unknown field (known: {', '.join(FIELDS)})")
    if "policy" not in data:
        raise invalid("policy", "this field is required: a policy document, whole or partial ({} for none)")
    window = parse_window(data.get("window", "1h"))
    top = data.get("top", TOP_TENANTS)
    if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= MAX_TOP_TENANTS:
        raise invalid("top", f"must be a whole number from 1 to {MAX_TOP_TENANTS}")
    return data["policy"], window, top


def refused(error: ConfigError) -> APIError:
    """A refused draft, as `loadpolicies` refuses a file, its path under `policy`: a 409 when
    it clashes with what is stored (a rule repeating another), else a 400."""
    field = f"policy.{error.path}" if error.path else "policy"
    if getattr(error, "conflict", False):
        return APIError(409, "conflict", f"{field}: {error.reason}", {field: error.reason})
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
        "`policy` (409 when a rule repeats another). An empty window answers zeros.",
    )
    def post(self, request):
        draft, window, top = parse_what_if(request.data)
        try:
            return Response(what_if(draft, window, top))
        except ConfigError as error:
            raise refused(error) from None
