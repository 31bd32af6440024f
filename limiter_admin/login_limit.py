"""A limit on the admin's login form per client address, decided by our own limiter.

Each login costs about 0.25 s of CPU (PBKDF2), and django-axes locks out a username only after
it failed for that username: a stranger who posts the form with a fresh username each time
is never locked out, and every post spends a worker's CPU. So each address may post the form
LIMITER_LOGIN_ATTEMPTS times at once, then LIMITER_LOGIN_PER_MINUTE times a minute (a token
bucket at the level `address`, on the limiter's own store: every worker counts together). A
post past that is answered 429 with Retry-After before the password is hashed.

The address is REMOTE_ADDR: behind a proxy every client is the proxy's address, so set the
limits for the proxy's traffic there (docs/OPERATIONS.md).
"""

from __future__ import annotations

import math
from functools import lru_cache

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string

from core import Decision, HierarchicalLimiter, MemoryStore
from policies.stores import limiter_store

LEVEL = "address"


@lru_cache(maxsize=1)
def login_limiter() -> HierarchicalLimiter:
    """The limiter of the login form, built once per process from the settings."""
    rule = {
        "type": "token_bucket",
        "capacity": settings.LIMITER_LOGIN_ATTEMPTS,
        "per_second": settings.LIMITER_LOGIN_PER_MINUTE / 60,
        "label": "LOGIN_ATTEMPTS",
    }
    # On Redis, the limiter's store: every worker counts together. In process, a store of its
    # own, which login_limiter.cache_clear() empties (the tests do, between tests).
    shared = limiter_store()
    store = MemoryStore() if isinstance(shared, MemoryStore) else shared
    # Open when the store is down: the admin's login must not depend on Redis being up.
    return HierarchicalLimiter.from_config({LEVEL: [rule]}, store=store, fail_modes={LEVEL: "open"})


def login_refusal(request: HttpRequest) -> HttpResponse | None:
    """The 429 for a login post past its address's limit; None when it may go on."""
    if request.method != "POST":
        return None
    address = request.META.get("REMOTE_ADDR") or "unknown"
    decision: Decision = login_limiter().acquire({LEVEL: address})
    if decision.allowed:
        return None
    wait = max(1, math.ceil(decision.retry_after)) if math.isfinite(decision.retry_after) else 60
    page = render_to_string("429.html", {"wait": wait})
    return HttpResponse(page, status=429, headers={"Retry-After": str(wait)})
