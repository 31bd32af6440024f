"""Forward-auth: `/api/v1/authz` and any path below it, any method but TRACE and CONNECT, for
gateways that ask an HTTP endpoint about each request and act on its status (nginx
`auth_request`, Traefik `ForwardAuth`, Caddy `forward_auth`, Envoy `ext_authz`, APISIX
`forward-auth`).

The request's headers say what to decide: each level's key in the header that
LIMITER_AUTHZ_KEYS names for it (the global level's key is always `*`), the cost in
`X-Limiter-Cost` (default 1, at least LIMITER_AUTHZ_MIN_COST), the priority class in
`X-Limiter-Priority`, and whether to take a concurrency slot in `X-Limiter-Slot` (1 or 0;
absent: LIMITER_AUTHZ_SLOTS, off by default: a request that takes none meets no concurrency
rule). The answer:

- allowed: 200, no body, the RateLimit fields, and `X-Limiter-Lease` (empty when no
  concurrency slot was taken: some gateways copy a header that is absent as a placeholder);
- denied: 429 with Retry-After and the RateLimit fields, and the decision as JSON; with
  `?deny_status=403`, a 403 carrying the wait in `X-Limiter-Retry-After` instead (nginx's
  auth_request passes on only 401 and 403);
- a request that cannot be decided: 400 naming the header, in the error shape.
"""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, PolymorphicProxySerializer, extend_schema

from core.params import LARGEST_NUMBER
from policies.headers import retry_after_header
from policies.services import decisions
from policies.services.answers import decision_body, decision_headers
from policies.services.errors import invalid
from policies.services.forward_auth import (
    DEFAULT_COST,
    authz_keys_problems,
    cost_from_header,
    keys_from_headers,
    min_cost_problems,
    slot_from_header,
)
from policies.services.inputs import MAX_KEY_LENGTH, parse_priority

from . import schemas
from .gateway import Answer, Call, GatewayView, described
from .schema_hooks import names_of

COST_HEADER = "X-Limiter-Cost"
PRIORITY_HEADER = "X-Limiter-Priority"
SLOT_HEADER = "X-Limiter-Slot"
LEASE_HEADER = "X-Limiter-Lease"  # carries the lease ticket (policies.services.leases)
RETRY_AFTER_HEADER = "X-Limiter-Retry-After"
DENY_STATUSES = (429, 403)


def _meta_name(header: str) -> str:
    """Where WSGI puts a request header: `X-Limiter-User` is META["HTTP_X_LIMITER_USER"]."""
    return "HTTP_" + header.upper().replace("-", "_")


def _header_parameters() -> list[OpenApiParameter]:
    """The request's header fields as the schema describes them: the key headers this
    deployment's LIMITER_AUTHZ_KEYS names, the cost from its LIMITER_AUTHZ_MIN_COST up
    (settings do not change while it runs)."""
    mapping = settings.LIMITER_AUTHZ_KEYS if not authz_keys_problems(settings.LIMITER_AUTHZ_KEYS) else {}
    key = {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH, "pattern": r"^\S(.*\S)?$"}
    return [
        *(
            OpenApiParameter(header, key, OpenApiParameter.HEADER, required=True, description=f"The {level} key.")
            for level, header in mapping.items()
        ),
        _cost_parameter(),
        OpenApiParameter(
            PRIORITY_HEADER,
            names_of("priority"),
            OpenApiParameter.HEADER,
            description="A priority class; absent: none.",
        ),
        OpenApiParameter(
            SLOT_HEADER,
            {"type": "string", "enum": ["0", "1"]},
            OpenApiParameter.HEADER,
            description="1: take a concurrency slot (its lease in X-Limiter-Lease), 0: take none, and meet no "
            "concurrency rule; absent: LIMITER_AUTHZ_SLOTS (off unless set).",
        ),
        OpenApiParameter(
            "deny_status",
            OpenApiTypes.INT,
            OpenApiParameter.QUERY,
            enum=list(DENY_STATUSES),
            description="Default 429.",
        ),
    ]


def _cost_parameter() -> OpenApiParameter:
    """X-Limiter-Cost from LIMITER_AUTHZ_MIN_COST up (above 0 with no floor); required when the
    floor is above the default cost."""
    floor = settings.LIMITER_AUTHZ_MIN_COST if not min_cost_problems(settings.LIMITER_AUTHZ_MIN_COST) else 0
    if not floor:
        cost = {"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": LARGEST_NUMBER}
        return OpenApiParameter(COST_HEADER, cost, OpenApiParameter.HEADER, description="Greater than 0; absent: 1.")
    cost = {"type": "number", "minimum": floor, "maximum": LARGEST_NUMBER}
    required = DEFAULT_COST < floor
    absent = "required (the default, 1, is below it)" if required else "absent: 1"
    return OpenApiParameter(
        COST_HEADER,
        cost,
        OpenApiParameter.HEADER,
        required=required,
        description=f"At least {floor:g} (LIMITER_AUTHZ_MIN_COST); {absent}.",
    )


_DESCRIPTION: dict[str, Any] = {
    "request": None,
    "parameters": _header_parameters(),
    "responses": {
        200: OpenApiResponse(description="Allowed: RateLimit fields; X-Limiter-Lease (empty: no slot)."),
        429: OpenApiResponse(schemas.DecisionFields, description="Denied: Retry-After, RateLimit fields."),
        **schemas.ERRORS,
        403: OpenApiResponse(
            PolymorphicProxySerializer(
                component_name="AuthzForbidden",
                serializers=[schemas.DecisionFields, schemas.Error],
                resource_type_field_name=None,
            ),
            description="With deny_status=403, denied: the decision, X-Limiter-Retry-After, the RateLimit "
            "fields. Or the credentials lack the scope: the error shape.",
        ),
    },
    "summary": "Forward-auth: may this request go? (any method)",
    # A group of its own: its ten operations (five methods, two paths) sort before /decisions
    # and opened the decisions group of /api/docs/.
    "tags": ["forward-auth"],
    "description": "For gateways' forward-auth: the keys come from request headers (LIMITER_AUTHZ_KEYS; "
    "the default shown), the answer is the status. See docs/GATEWAYS.md.",
}
_DESCRIBED_METHODS = ("get", "post", "put", "patch", "delete")
# Any path below /authz answers the same: described once more, with operation ids of its own.
BELOW = described(
    "AuthzBelow",
    **{method: extend_schema(operation_id=f"v1_authz_below_{method}", **_DESCRIPTION) for method in _DESCRIBED_METHODS},
)


class AuthzView(GatewayView):
    """Forward-auth: one decision from the request's headers, answered by status."""

    # Every method a request through a gateway has; not TRACE or CONNECT, which gateways do not forward.
    methods = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
    endpoint = "authz"
    negotiate = False  # the client's Accept reaches us; the answer is a status
    reads_json = False  # the client's body is not ours to read
    schema = described("Authz", **dict.fromkeys(_DESCRIBED_METHODS, extend_schema(**_DESCRIPTION)))

    def answer(self, call: Call, **kwargs: Any) -> Answer:
        meta = call.request.META
        deny_status = _deny_status(call.request.GET)
        policy = decisions.current_policy()
        keys = keys_from_headers(lambda name: meta.get(_meta_name(name)), settings.LIMITER_AUTHZ_KEYS, policy.levels)
        cost = cost_from_header(meta.get(_meta_name(COST_HEADER)), COST_HEADER, settings.LIMITER_AUTHZ_MIN_COST)
        priority = parse_priority(meta.get(_meta_name(PRIORITY_HEADER)), policy.priorities, PRIORITY_HEADER)
        slots = slot_from_header(meta.get(_meta_name(SLOT_HEADER)), SLOT_HEADER, settings.LIMITER_AUTHZ_SLOTS)
        decided = decisions.decide(keys, cost, priority, slots)
        decision = decided.decision
        headers = decision_headers(decided.limiter, keys, decision)
        if decision.allowed:
            headers[LEASE_HEADER] = decided.ticket or ""
            return Answer(None, headers)
        if deny_status == 403:
            wait = headers.pop("Retry-After", None)
            if wait is None and math.isfinite(decision.retry_after):
                wait = retry_after_header(decision.retry_after)
            if wait is not None:
                headers[RETRY_AFTER_HEADER] = wait
        return Answer(decision_body(decision), headers, deny_status)


def _deny_status(query) -> int:
    for name in query:
        if name != "deny_status":
            raise invalid(name, "unknown query parameter (known: deny_status)")
    raw = query.get("deny_status")
    if raw is None:
        return 429
    if raw not in ("403", "429"):
        raise invalid("deny_status", f"must be 403 or 429, not {raw!r}")
    return int(raw)
