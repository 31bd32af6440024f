"""Envoy's rate limit service over gRPC: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`,
served with grpcio and the stubs Envoy generates (the xds-protos package).

    server = start_server("127.0.0.1:8081")   # manage.py serve_rls; gunicorn's workers (RLS_BIND)
    ...
    server.stop(grace=1)

The mapping of a request onto our levels, and the answer, are policies/services/rls.py's; this
module is the transport, and `status_of` its one mapping of errors to status codes: a request
that is not one decision (unknown domain or level, no descriptors, a bad cost) gets
INVALID_ARGUMENT with the reason; with LIMITER_RLS_REQUIRE_TOKEN, a call without a service
token in its metadata (`authorization: Bearer ...`) gets UNAUTHENTICATED, and one whose token
may not decide PERMISSION_DENIED; no policy or database to decide with gets UNAVAILABLE. A
store that is down is no error: the levels' fail modes decide, as on every other path.
"""

from __future__ import annotations

import ipaddress
import logging
from concurrent import futures
from typing import Any

import grpc
from django.conf import settings
from django.db import DatabaseError, close_old_connections
from envoy.service.ratelimit.v3 import rls_pb2_grpc

from core import InvalidRequest, StoreUnavailable

from .compile import PolicyUnavailable
from .services.auth import deciding_identity
from .services.errors import Busy, Forbidden, Invalid, ServiceError, Unauthenticated
from .services.rls import should_rate_limit

log = logging.getLogger(__name__)

# Threads deciding at once: a decision waits on the store for at most LIMITER_STORE_TIMEOUT.
WORKERS = 16


class RateLimitService(rls_pb2_grpc.RateLimitServiceServicer):
    """ShouldRateLimit, one decision per call."""

    def ShouldRateLimit(self, request: Any, context: Any) -> Any:  # noqa: N802  (the protocol's name)
        try:
            if settings.LIMITER_RLS_REQUIRE_TOKEN:
                deciding_identity(_metadata(context, "authorization"), "metadata authorization")
            return should_rate_limit(request, "rls").response
        except Exception as error:
            code, message = status_of(error)
            if code is None:
                raise  # a bug: grpcio answers UNKNOWN and logs it
            context.abort(code, message)


def status_of(error: Exception) -> tuple[Any, str]:
    """The gRPC status code and message that answer `error`, in this one place; (None, "")
    for an error that is a bug."""
    if isinstance(error, (Invalid, InvalidRequest)):
        return grpc.StatusCode.INVALID_ARGUMENT, str(error)
    if isinstance(error, Unauthenticated):
        return grpc.StatusCode.UNAUTHENTICATED, error.reason
    if isinstance(error, Forbidden):
        return grpc.StatusCode.PERMISSION_DENIED, error.reason
    if isinstance(error, Busy):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, error.reason
    if isinstance(error, ServiceError):
        return grpc.StatusCode.FAILED_PRECONDITION, str(error)
    if isinstance(error, (PolicyUnavailable, StoreUnavailable)):
        return grpc.StatusCode.UNAVAILABLE, f"cannot decide now: {error}"
    if isinstance(error, DatabaseError):
        close_old_connections()  # a broken connection is not kept for the next call
        return grpc.StatusCode.UNAVAILABLE, f"cannot decide now: the database failed ({error})"
    return None, ""


def _metadata(context: Any, name: str) -> str:
    return next((value for key, value in context.invocation_metadata() if key == name), "")


def refusal_to_serve(bind: str) -> str | None:
    """Why the service may not listen on `bind` (None: it may): without a token required
    (LIMITER_RLS_REQUIRE_TOKEN=0), anyone who reaches the port spends tenants' limits, so only
    a loopback address may serve so."""
    if settings.LIMITER_RLS_REQUIRE_TOKEN or is_loopback(bind.rsplit(":", 1)[0]):
        return None
    return (
        f"refusing to serve Envoy's rate limit service on {bind!r} without a token: "
        "LIMITER_RLS_REQUIRE_TOKEN=0 lets whoever reaches that address spend tenants' limits. "
        "Require a token (LIMITER_RLS_REQUIRE_TOKEN=1, the default; Envoy sends it as "
        "docs/GATEWAYS.md shows), or bind a loopback address (127.0.0.1, [::1], localhost)"
    )


def is_loopback(host: str) -> bool:
    """Whether a bind address's host is loopback only: 127.0.0.0/8, ::1 or localhost. A name
    other than localhost, or a wildcard (0.0.0.0, [::]), is not."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def start_server(bind: str, reuse_port: bool = False, workers: int = WORKERS) -> Any:
    """A started grpc.Server on `bind` (host:port; port 0 picks one: `server.port`).
    `reuse_port`: let other processes bind the same port (gunicorn's workers on a shared
    store); off, a port already taken is an error rather than traffic split with a stranger.
    RuntimeError when the address cannot be bound, or may not be (`refusal_to_serve`)."""
    refused = refusal_to_serve(bind)
    if refused:
        raise RuntimeError(refused)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rls"),
        options=[("grpc.so_reuseport", 1 if reuse_port else 0)],
    )
    rls_pb2_grpc.add_RateLimitServiceServicer_to_server(RateLimitService(), server)
    try:
        port = server.add_insecure_port(bind)
    except RuntimeError as error:
        raise RuntimeError(f"cannot serve Envoy's rate limit service on {bind!r}: {error}") from None
    if not port:
        raise RuntimeError(f"cannot serve Envoy's rate limit service on {bind!r}")
    server.start()
    server.port = port
    log.info("Envoy's rate limit service (gRPC) on %s", bind.rsplit(":", 1)[0] + f":{port}")
    return server
