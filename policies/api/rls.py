"""POST /api/v1/rls/json: envoyproxy/ratelimit's HTTP contract on the gateways' path, the JSON
form of Envoy's rate limit service (the mapping is policies.services.rls)."""

from __future__ import annotations

from typing import Any

from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf import json_format

from policies.services.errors import invalid
from policies.services.rls import should_rate_limit

from .gateway import Answer, Call, GatewayView


class RlsJsonView(GatewayView):
    """POST /api/v1/rls/json: envoyproxy/ratelimit's HTTP contract on the gateways' path."""

    endpoint = "rls_json"
    # Not in the OpenAPI schema: what makes a request one decision (one key per level across
    # descriptors, one cost, a level in each) is more than a JSON schema can state, so data
    # that fits any schema we could write would not all be accepted. docs/GATEWAYS.md has it.
    schema = None

    def answer(self, call: Call, **kwargs: Any) -> Answer:
        data = call.data
        if not isinstance(data, dict):
            raise invalid("body", "must be a JSON object: a RateLimitRequest")
        request = rls_pb2.RateLimitRequest()
        try:
            json_format.ParseDict(data, request)
        except json_format.ParseError as error:
            raise invalid("body", f"not a RateLimitRequest: {error}") from None
        answer = should_rate_limit(request, endpoint=None)  # the gateway path times the request
        headers = {h.key: h.value for h in answer.response.response_headers_to_add}
        return Answer(json_format.MessageToDict(answer.response), headers, 200 if answer.decision.allowed else 429)
