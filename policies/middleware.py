"""A Django middleware that rate-limits paths by prefix (seed 001), on the process's shared
store: one of the three faces of policies/embedding.py, with the decorator and the DRF
throttle.

    MIDDLEWARE = [
        ...,
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "policies.middleware.LimiterMiddleware",   # after it: clients are users when logged in
        ...,
    ]
    LIMITER_MIDDLEWARE = {
        "paths": ["/export/", "/api/v1/decisions"],   # path prefixes to protect (of path_info)
        "rate": "5/s", "burst": 10,                   # or "rules": [...], or "tier"/"team"
        # "policy", "quota", "window", "key", "cost": as LIMITER_THROTTLE (policies/throttling.py)
        # "denied_view": "myapp.views.slow_down",     # answers a denial instead of the 429
    }

Requests under one of `paths` are decided per client (`client_key`: `user:<pk>` when the
session is logged in, else `ip:<address>`); others pass untouched. It works in a sync and an
async middleware chain alike (WSGI or ASGI): in an async one it decides with the async path.
A denial answers 429 itself, without calling the view, in the API's error shape:

    {"error": {"code": "rate_limited", "message": "Too many requests; try again in 3 seconds.",
               "fields": {}}}

with `Retry-After` (whole seconds, rounded up; none when the request can never fit),
`RateLimit-Policy` and `RateLimit`. Allowed answers carry the two RateLimit fields too.
DRF authenticates inside the view, so a client that sends only a Bearer token is its
address here; limit those per token with the DRF throttle instead.

Without `LIMITER_MIDDLEWARE` the middleware removes itself (MiddlewareNotUsed). A bad setting
stops start-up with ImproperlyConfigured naming the field. `timer` is the inline rules'
injected clock (None: the store's).
"""

from __future__ import annotations

from collections.abc import Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.exceptions import MiddlewareNotUsed
from django.http import HttpRequest, HttpResponseBase

from .embedding import MIDDLEWARE, Limit, limit_for, rate_limited_response
from .services.answers import RATE_LIMITED

__all__ = ["RATE_LIMITED", "LimiterMiddleware", "rate_limited_response"]


class LimiterMiddleware:
    """Limits each client on the path prefixes of `LIMITER_MIDDLEWARE`."""

    setting = "LIMITER_MIDDLEWARE"
    timer: Callable[[], float] | None = None
    face = MIDDLEWARE
    sync_capable = True
    async_capable = True

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
        # Compiled now, so that a bad setting fails at start-up, not at the first request.
        if self.limit() is None:
            raise MiddlewareNotUsed(f"{self.setting} is not set")

    @classmethod
    def limit(cls) -> Limit | None:
        return limit_for(cls, cls.setting, with_paths=True)

    def __call__(self, request: HttpRequest):
        if self.is_async:
            return self.__acall__(request)
        limit = self.limit()
        if limit is None or not request.path_info.startswith(limit.paths):
            return self.get_response(request)
        return limit.serve(request, self.get_response)

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        limit = self.limit()
        if limit is None or not request.path_info.startswith(limit.paths):
            return await self.get_response(request)
        return await limit.aserve(request, self.get_response)
