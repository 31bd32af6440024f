"""A DRF throttle on the process's shared store (seed 001's `allow_request`, per client): one
of the three faces of policies/embedding.py, with the decorator and the middleware.

    REST_FRAMEWORK = {"DEFAULT_THROTTLE_CLASSES": ["policies.throttling.LimiterThrottle"], ...}
    # or, on one view:  throttle_classes = [LimiterThrottle]

Settings (the middleware, policies/middleware.py, reads the same shape from
`LIMITER_MIDDLEWARE`, plus `paths`):

    LIMITER_THROTTLE = {
        "rate": "10/s",         # a token bucket refilling at this rate: "N/s", "N/min",
                                # "N/hour", "N/day" (DRF's spelling: the unit's first letter
                                # counts), or a number per second
        "burst": 20,            # optional: the bucket's capacity, the most at once
                                # (default: N, the rate's count)
        # instead of rate and burst, any engine rule specs, all applied (seed 001's shape):
        # "rules": [{"type": "sliding_window", "limit": 100, "window": 60}],
        "policy": "default",    # optional: the name in RateLimit-Policy and RateLimit
        "quota": 20,            # optional: the advertised quota and window (seconds); by
        "window": 2,            # default those of the rule with the smallest capacity
                                # (a bucket's window: its time to refill from empty)
        "key": "myapp.limits.client_key",  # optional: callable(request) -> str | None,
                                # a dotted path or the callable; None means "not limited".
                                # Default: policies.embedding.client_key
        # instead of rate or rules, the console's policies (edited live):
        # "tier": "pro",        # that tier's rules, the key at the user level
        # "team": "myapp.limits.team_of",  # the tenant whose rules apply (its tier's, or
                                # its overrides); with "tier", only its team-level key
        "cost": 1,              # optional: a number, or a callable(request) (dotted path)
    }

Each client (`client_key`: `user:<pk>` when authenticated, else `ip:<address>`, the address
behind proxies as LIMITER_IP_HEADER says) has its own buckets in the process's store: Redis
with REDIS_URL, shared by every worker and machine, so the limit is exact across them; else
this process's memory (one process only: the system checks refuse it under several workers).

A denial returns False and `wait()` the whole seconds to wait, the BaseThrottle contract:
DRF raises Throttled, and the project's exception handler (`REST_FRAMEWORK
["EXCEPTION_HANDLER"] = "policies.api.errors.handle_exception"`) answers 429 in the API's
error shape, `{"error": {"code": "rate_limited", ...}}`, with `Retry-After`. Every answer
of the view, allowed or not, carries `RateLimit-Policy` and `RateLimit` (policies/headers.py):
the throttle puts them in `view.headers`, which DRF's `finalize_response` copies onto the
response, whatever the exception handler. Several limiter throttles on one view list their
policies side by side, as the draft's fields allow.

`timer` is the inline rules' clock (None: the store's), injected like DRF's own throttles':
tests set it to a ManualClock. The limiter is built on first use and rebuilt when a
`LIMITER_*` setting changes. DRF calls throttles from its sync dispatch (in a thread under
ASGI), so the throttle decides with the sync path; a concurrency slot it takes is held until
its lease runs out (the decorator and the middleware release it when the view returns).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError
from rest_framework import exceptions
from rest_framework.throttling import BaseThrottle

from core import Decision, InvalidRequest

from .compile import PolicyUnavailable
from .embedding import (
    LIMIT_FIELDS,
    RATELIMIT_LISTS,
    THROTTLE,
    Clocked,
    Limit,
    build_limit,
    client_key,
    limit_for,
    merge_headers,
    reset_limits,
)
from .headers import retry_after_header
from .services.answers import denial_message

__all__ = [
    "LIMIT_FIELDS",
    "RATELIMIT_LISTS",
    "Clocked",
    "Limit",
    "LimiterThrottle",
    "build_limit",
    "client_key",
    "denial_message",
    "limit_for",
    "merge_headers",
    "reset_limits",
]


class PolicyDatabaseUnavailable(exceptions.APIException):
    """No policy to decide with yet: the database is down (a warm worker goes on with the
    last policy it read)."""

    status_code = 503
    default_detail = "the policy database is unreachable; try again"
    default_code = "database_unavailable"


class LimiterThrottle(BaseThrottle):
    """Limits each client by the `LIMITER_THROTTLE` setting (see the module docstring).
    Subclass to give another view its own limits: `setting = "LIMITER_UPLOAD_THROTTLE"`,
    or a cost per request with `get_cost()`."""

    setting = "LIMITER_THROTTLE"
    timer: Callable[[], float] | None = None
    face = THROTTLE
    cost = 1

    decision: Decision | None = None

    @classmethod
    def limit(cls) -> Limit:
        limit = limit_for(cls, cls.setting)
        if limit is None:
            raise ImproperlyConfigured(
                f'{cls.__name__} needs the {cls.setting} setting (e.g. {{"rate": "10/s", "burst": 20}})'
            )
        return limit

    def get_cost(self, request, view) -> float:
        """The request's cost: the setting's `cost` (a number or a callable of the request),
        else the class's `cost`."""
        cost = self.limit().cost
        if callable(cost):
            return cost(request)
        return cost if cost != 1 else self.cost

    def allow_request(self, request, view) -> bool:
        limit = self.limit()
        try:
            decided = limit.decide_request(request, self.get_cost(request, view))
        except InvalidRequest as error:
            raise exceptions.ValidationError({error.field or "request": [error.reason]}) from None
        except (PolicyUnavailable, DatabaseError):
            raise PolicyDatabaseUnavailable() from None
        if decided is None:
            return True
        self.decision = decided.decision
        request.limit = decided.decision
        headers = getattr(view, "headers", None)  # what finalize_response copies onto the answer
        if isinstance(headers, dict):
            fields = limit.answer_headers(decided)
            fields.pop("Retry-After", None)  # DRF's Throttled sets it from wait()
            merge_headers(headers, fields)
        return decided.decision.allowed

    def wait(self) -> float | None:
        """Whole seconds until the denied request fits (rounded up, as Retry-After);
        None when it never will."""
        if self.decision is None or self.decision.allowed or not math.isfinite(self.decision.retry_after):
            return None
        return float(retry_after_header(self.decision.retry_after))
