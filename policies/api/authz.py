"""Forward-auth: `/api/v1/authz` and any path below it, any method but TRACE and CONNECT, for
gateways that ask an HTTP endpoint about each request and act on its status (nginx
`auth_request`, Traefik `ForwardAuth`, Caddy `forward_auth`, Envoy `ext_authz`, APISIX
`forward-auth`).

The request's headers say what to decide: each level's key in the header that
LIMITER_AUTHZ_KEYS names for it (the global level's key is always `*`), the cost in
`X-Limiter-Cost` (default 1), the priority class in `X-Limiter-Priority`. The answer:

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
from policies.compile import GLOBAL_LEVEL, TENANT_LEVEL, policy_cache
from policies.headers import retry_after_header
from policies.leases import lease_id

from . import schemas
from .answers import decision_body, decision_headers
from .errors import invalid
from .gateway import Answer, Call, GatewayView, described
from .observe import record
from .requests import MAX_KEY_LENGTH, number, parse_priority
from .schema_hooks import names_of

COST_HEADER = "X-Limiter-Cost"
PRIORITY_HEADER = "X-Limiter-Priority"
LEASE_HEADER = "X-Limiter-Lease"
RETRY_AFTER_HEADER = "X-Limiter-Retry-After"
DENY_STATUSES = (429, 403)
GLOBAL_KEY = "*"
# RFC 9110's token characters: what a header's name may hold.
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _meta_name(header: str) -> str:
    """Where WSGI puts a request header: `X-Limiter-User` is META["HTTP_X_LIMITER_USER"]."""
    return "HTTP_" + header.upper().replace("-", "_")


def authz_keys_problems(mapping: Any) -> list[str]:
    """What is wrong with a LIMITER_AUTHZ_KEYS value: it maps level names to header names."""
    if not isinstance(mapping, dict) or not mapping:
        return [f"must be a JSON object mapping level names to header names, not {mapping!r}"]
    problems = []
    for level, header in mapping.items():
        if level == GLOBAL_LEVEL:
            problems.append(f"{level!r}: the global level's key is always {GLOBAL_KEY!r}, from no header")
        elif not isinstance(header, str) or not header or not set(header) <= _TOKEN:
            problems.append(f"{level!r}: {header!r} is not a header name")
    return problems


def _header_parameters() -> list[OpenApiParameter]:
    """The request's header fields as the schema describes them: the key headers this
    deployment's LIMITER_AUTHZ_KEYS names (settings do not change while it runs)."""
    mapping = settings.LIMITER_AUTHZ_KEYS if not authz_keys_problems(settings.LIMITER_AUTHZ_KEYS) else {}
    key = {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH, "pattern": r"^\S(.*\S)?$"}
    cost = {"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": LARGEST_NUMBER}
    return [
        *(
            OpenApiParameter(header, key, OpenApiParameter.HEADER, required=True, description=f"The {level} key.")
            for level, header in mapping.items()
        ),
        OpenApiParameter(COST_HEADER, cost, OpenApiParameter.HEADER, description="Greater than 0; absent: 1."),
        OpenApiParameter(
            PRIORITY_HEADER,
            names_of("priority"),
            OpenApiParameter.HEADER,
            description="A priority class; absent: none.",
        ),
        OpenApiParameter(
            "deny_status",
            OpenApiTypes.INT,
            OpenApiParameter.QUERY,
            enum=list(DENY_STATUSES),
            description="Default 429.",
        ),
    ]


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
    "tags": ["decisions"],
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
        policy = policy_cache().current()
        keys = _keys(meta, policy.levels)
        cost = _cost(meta.get(_meta_name(COST_HEADER)))
        priority = parse_priority(meta.get(_meta_name(PRIORITY_HEADER)), policy.priorities, PRIORITY_HEADER)
        limiter = policy_cache().limiter_for(keys.get(TENANT_LEVEL))
        decision = limiter.acquire(keys, cost, priority)
        record(keys, decision, cost, priority)
        headers = decision_headers(limiter, keys, decision)
        if decision.allowed:
            headers[LEASE_HEADER] = lease_id(keys, decision.lease) or ""
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


def _keys(meta, levels: tuple[str, ...]) -> dict[str, str]:
    """Each mapped level's key from its header, in the policy's level order, and `*` at the
    global level when the policy has one."""
    mapping = settings.LIMITER_AUTHZ_KEYS
    keys = {}
    for level in levels:
        if level == GLOBAL_LEVEL:
            keys[level] = GLOBAL_KEY
            continue
        header = mapping.get(level)
        if header is None:
            continue
        key = meta.get(_meta_name(header))
        if not key:
            raise invalid(header, f"this header is required: it carries the {level} key")
        if len(key) > MAX_KEY_LENGTH:
            raise invalid(header, f"must be at most {MAX_KEY_LENGTH} characters")
        keys[level] = key
    for level, header in mapping.items():
        if level not in levels:
            raise invalid(header, f"LIMITER_AUTHZ_KEYS maps it to level {level!r}, which is not configured")
    return keys


def _cost(raw: str | None) -> float:
    if raw is None:
        return 1
    try:
        value = float(raw.strip())
    except ValueError:
        raise invalid(COST_HEADER, f"must be a number, not {raw!r}") from None
    return number(value, COST_HEADER)
