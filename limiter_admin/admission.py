"""The gateways' paths first: a worker runs at most LIMITER_CONSOLE_CONCURRENCY console requests
at once, and answers any more at once with 503 and Retry-After, before they cost anything.

A gateway waits on every decision; an operator can wait a second. Every request takes one of a
worker's threads, in the order they came (gunicorn's gthread worker), so a flood of console
requests (strangers posting the login form, a script asking for reports) would take every
thread and the gateways' decisions would queue behind them. So console requests beyond the
bound are turned away first thing, and at least (threads - LIMITER_CONSOLE_CONCURRENCY) threads
stay the gateways'. The gateway paths (`GATEWAY_PATHS`) and the probes never wait here;
static files are served before this (WhiteNoise).

With LIMITER_CONSOLE_CONCURRENCY=0 a worker serves the gateways' paths alone (404 for the
rest): a pool of its own for the gateways, beside another that serves the console at a lower
CPU priority (LIMITER_WORKER_NICE; docs/OPERATIONS.md, `make run` with GATEWAY_BIND).

`GATEWAY_PATHS` is the one list of the gateways' paths (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import os
import threading

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string

from policies.services.errors import error_body

# The paths a gateway calls on every request, and the probes: never held back.
GATEWAY_PATHS = (
    "/api/v1/decisions",
    "/api/v1/authz",
    "/api/v1/rls/json",
    "/api/v1/leases/",
    "/api/v1/reservations",
    "/healthz",
    "/readyz",
    "/metrics",
)
BUSY = "the console is busy in this worker; try again in a second (the gateways' decisions come first)"
ELSEWHERE = "this pool serves the gateways' paths alone; the console is served by the other"


def is_gateway_path(path: str) -> bool:
    return path.startswith(GATEWAY_PATHS)


def console_concurrency() -> int:
    """LIMITER_CONSOLE_CONCURRENCY, or when unset half the worker's threads (gunicorn_conf.py
    says how many it has; 8 elsewhere): never all of them, or console requests that wait (a
    what-if waits for its replay) could hold every thread."""
    most = settings.LIMITER_CONSOLE_CONCURRENCY
    if most is not None:
        return most
    return max(1, int(os.environ.get("LIMITER_WORKER_THREADS") or 8) // 2)


class ConsoleAdmission:
    """Middleware: at most LIMITER_CONSOLE_CONCURRENCY console requests at once in this
    process, the rest answered 503 at once."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        most = console_concurrency()
        self.slots = threading.BoundedSemaphore(most) if most else None

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if is_gateway_path(request.path):
            return self.get_response(request)
        if self.slots is None:
            return refused(request, 404, "not_found", ELSEWHERE)
        if not self.slots.acquire(blocking=False):
            return refused(request, 503, "busy", BUSY)
        try:
            return self.get_response(request)
        finally:
            self.slots.release()


def refused(request: HttpRequest, status: int, code: str, message: str) -> HttpResponse:
    """The API's error shape on its paths, else a small page; a 503 says when to come back."""
    response: HttpResponse
    if request.path.startswith("/api/"):
        response = JsonResponse(error_body(code, message), status=status)
    else:
        page = render_to_string("refused.html", {"status": status, "message": message})
        response = HttpResponse(page, status=status)
    if status == 503:
        response["Retry-After"] = "1"
    return response
