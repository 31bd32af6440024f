"""Envoy's rate limit service over gRPC: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`,
served with grpcio and the stubs Envoy generates (the xds-protos package).

    server = start_server("127.0.0.1:8081")   # manage.py serve_rls; gunicorn's workers (RLS_BIND)
    ...
    server.stop(grace=1)

The mapping of a request onto our levels, and the answer, are policies/api/rls.py's. Errors:
a request that is not one decision (unknown domain or level, no descriptors, a bad cost) gets
INVALID_ARGUMENT with the reason; with LIMITER_RLS_REQUIRE_TOKEN, a call without a decide-scope
service token in its metadata (`authorization: Bearer ...`) gets UNAUTHENTICATED; no policy
or database to decide with gets UNAVAILABLE. A store that is down is no error: the levels'
fail modes decide, as on every other path.
"""

from __future__ import annotations

import logging
from concurrent import futures
from typing import Any

import grpc
from django.conf import settings
from django.db import DatabaseError, close_old_connections
from envoy.service.ratelimit.v3 import rls_pb2_grpc
from rest_framework.exceptions import APIException

from core import InvalidRequest, StoreUnavailable

from .api.auth import DECIDING_SCOPES, bearer_identity
from .api.errors import APIError
from .api.rls import should_rate_limit
from .compile import PolicyUnavailable

log = logging.getLogger(__name__)

# Threads deciding at once: a decision waits on the store for at most LIMITER_STORE_TIMEOUT.
WORKERS = 16


class RateLimitService(rls_pb2_grpc.RateLimitServiceServicer):
    """ShouldRateLimit, one decision per call."""

    def ShouldRateLimit(self, request: Any, context: Any) -> Any:  # noqa: N802  (the protocol's name)
        try:
            if settings.LIMITER_RLS_REQUIRE_TOKEN:
                refused = _refusal(context)
                if refused:
                    context.abort(grpc.StatusCode.UNAUTHENTICATED, refused)
            return should_rate_limit(request, "rls").response
        except APIError as error:
            if error.status_code != 400:
                raise
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, error.message)
        except InvalidRequest as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except (PolicyUnavailable, StoreUnavailable) as error:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot decide now: {error}")
        except DatabaseError as error:
            close_old_connections()  # a broken connection is not kept for the next call
            context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot decide now: the database failed ({error})")


def _refusal(context: Any) -> str | None:
    """Why the call may not decide (None: it may): its metadata must carry a decide- or
    admin-scope service token."""
    header = next((value for key, value in context.invocation_metadata() if key == "authorization"), "")
    try:
        identity = bearer_identity(header)
    except APIException as error:
        return str(error.detail)
    if identity is None:
        return "needs metadata authorization: Bearer <decide-scope service token>"
    if identity.scope not in DECIDING_SCOPES:
        return f"token {identity.name!r} may not decide"
    return None


def start_server(bind: str, reuse_port: bool = False, workers: int = WORKERS) -> Any:
    """A started grpc.Server on `bind` (host:port; port 0 picks one: `server.port`).
    `reuse_port`: let other processes bind the same port (gunicorn's workers on a shared
    store); off, a port already taken is an error rather than traffic split with a stranger.
    RuntimeError when the address cannot be bound."""
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
