"""A Django middleware that rate-limits paths by prefix on the in-process engine (seed 001).

    MIDDLEWARE = [
        ...,
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "policies.middleware.LimiterMiddleware",   # after it: clients are users when logged in
        ...,
    ]
    LIMITER_MIDDLEWARE = {
        "paths": ["/export/", "/api/v1/decisions"],   # path prefixes to protect (of path_info)
        "rate": "5/s", "burst": 10,                   # or "rules": [...]
        # "policy", "quota", "window", "key": as LIMITER_THROTTLE (policies/throttling.py)
    }

Requests under one of `paths` are decided per client (`client_key`: `user:<pk>` when the
session is logged in, else `ip:<REMOTE_ADDR>`); others pass untouched. A denial answers 429
itself, without calling the view, in the API's error shape:

    {"error": {"code": "rate_limited", "message": "Too many requests; try again in 3 seconds.",
               "fields": {}}}

with `Retry-After` (whole seconds, rounded up; none when the request can never fit),
`RateLimit-Policy` and `RateLimit`. Allowed answers carry the two RateLimit fields too.
DRF authenticates inside the view, so a client that sends only a Bearer token is its
address here; limit those per token with the DRF throttle instead.

Without `LIMITER_MIDDLEWARE` the middleware removes itself (MiddlewareNotUsed). A bad setting
stops start-up with ImproperlyConfigured naming the field. `timer` is the injected clock.
"""

from __future__ import annotations

import time

from django.core.exceptions import MiddlewareNotUsed
from django.http import HttpRequest, HttpResponseBase, JsonResponse

from core import Decision

from .throttling import Limit, denial_message, limit_for, merge_headers

RATE_LIMITED = "rate_limited"


class LimiterMiddleware:
    """Limits each client on the path prefixes of `LIMITER_MIDDLEWARE`."""

    setting = "LIMITER_MIDDLEWARE"
    timer = time.monotonic

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        # Compiled now, so that a bad setting fails at start-up, not at the first request.
        if self.limit() is None:
            raise MiddlewareNotUsed(f"{self.setting} is not set")

    @classmethod
    def limit(cls) -> Limit | None:
        return limit_for(cls, cls.setting, with_paths=True)

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        limit = self.limit()
        if limit is None or not request.path_info.startswith(limit.paths):
            return self.get_response(request)
        key = limit.key(request)
        if key is None:
            return self.get_response(request)
        decision = limit.decide(key)
        response = self.get_response(request) if decision.allowed else rate_limited_response(decision)
        merge_headers(response, limit.headers(decision))
        return response


def rate_limited_response(decision: Decision) -> JsonResponse:
    """429 in the API's error shape (the headers are added by the caller)."""
    return JsonResponse(
        {"error": {"code": RATE_LIMITED, "message": denial_message(decision), "fields": {}}}, status=429
    )
