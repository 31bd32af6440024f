"""One error shape for the whole API: `{"error": {"code", "message", "fields"}}`.

The REST transport's one mapping of errors to answers: the service layer's
(policies.services.errors), DRF's exceptions, the engine's errors and the database's are all
turned into a status and that shape here, so no view formats an error of its own. `fields`
maps dotted paths (`requests.3.cost`) to what is wrong there; `message` repeats the first of
them, so a log line alone says enough.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response

from core import ConfigError, InvalidRequest, StoreUnavailable
from core.errors import LimiterError
from policies.compile import PolicyUnavailable
from policies.services.errors import (
    Busy,
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    ServiceError,
    Unauthenticated,
    error_body,
)

# The status of each kind of the service layer's errors.
SERVICE_STATUS: dict[type[ServiceError], int] = {
    Invalid: 400,
    Unauthenticated: 401,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    Busy: 503,
}

log = logging.getLogger(__name__)


def flatten(detail: Any, path: str = "") -> dict[str, str]:
    """DRF's nested error detail as {dotted path: first message}."""
    if isinstance(detail, dict):
        found = {}
        for name, value in detail.items():
            name = "" if name == "non_field_errors" else str(name)
            found.update(flatten(value, f"{path}.{name}" if path and name else path or name))
        return found
    if isinstance(detail, list):
        if detail and all(not isinstance(item, (dict, list)) for item in detail):
            return {path: str(detail[0])}
        found = {}
        for index, item in enumerate(detail):
            if item:
                found.update(flatten(item, f"{path}.{index}" if path else str(index)))
        return found
    return {path: str(detail)}


def _message(fields: dict[str, str], fallback: str) -> str:
    if not fields:
        return fallback
    field, text = next(iter(fields.items()))
    return f"{field}: {text}" if field else text


_CODES = {
    exceptions.ParseError: (400, "malformed_request"),
    exceptions.NotAuthenticated: (401, "not_authenticated"),
    exceptions.AuthenticationFailed: (401, "authentication_failed"),
    exceptions.PermissionDenied: (403, "permission_denied"),
    exceptions.NotFound: (404, "not_found"),
    exceptions.MethodNotAllowed: (405, "method_not_allowed"),
    exceptions.NotAcceptable: (406, "not_acceptable"),
    exceptions.UnsupportedMediaType: (415, "unsupported_media_type"),
    exceptions.Throttled: (429, "rate_limited"),
}


def handle_exception(exc: Exception, context: dict) -> Response | None:
    """DRF's EXCEPTION_HANDLER: every error a view raises, in the one shape."""
    found = error_answer(exc)
    if found is None:
        return None  # a bug: Django's 500 handler answers (in the same shape, see server_error)
    status_code, body, headers = found
    return Response(body, status=status_code, headers=headers)


def error_answer(exc: Exception) -> tuple[int, dict, dict] | None:
    """The status, body and header fields that answer `exc`, for DRF's views and the gateway
    path alike; None for an exception that is a bug."""
    headers: dict[str, str] = {}
    if isinstance(exc, ServiceError):
        if isinstance(exc, Busy):
            headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
        return SERVICE_STATUS.get(type(exc), 400), error_body(exc.code, exc.message, exc.fields), headers
    if isinstance(exc, RequestDataTooBig):
        # Django answers this with its debug page under DEBUG, whatever handler400 says.
        return 400, error_body("malformed_request", too_big_message()), headers
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    if isinstance(exc, exceptions.ValidationError):
        fields = flatten(exc.detail)
        return 400, error_body("invalid", _message(fields, "invalid request"), fields), headers
    if isinstance(exc, InvalidRequest):
        fields = {exc.field: str(exc).split(": ", 1)[-1]} if exc.field else {}
        return 400, error_body("invalid", str(exc), fields), headers
    if isinstance(exc, ConfigError):
        fields = {exc.path: exc.reason} if exc.path else {}
        return 400, error_body("invalid", str(exc), fields), headers
    if isinstance(exc, StoreUnavailable):
        body = error_body("store_unavailable", f"the limiter's store is unreachable: {exc}")
        return 503, body, {"Retry-After": "1"}
    if isinstance(exc, (DatabaseError, PolicyUnavailable)):
        # PolicyUnavailable: a worker that started while the database was down has no
        # policy to decide with yet (a warm one goes on with the last policy it read).
        log.warning("database error in the API: %s", exc)
        return (
            503,
            error_body("database_unavailable", "the policy database is unreachable; try again"),
            {"Retry-After": "1"},
        )
    if isinstance(exc, LimiterError):
        return 400, error_body("invalid", str(exc)), headers
    if isinstance(exc, exceptions.APIException):
        status_code, code = _CODES.get(type(exc), (exc.status_code, "error"))
        status_code = exc.status_code  # DRF turns a 401 into 403 when no scheme can challenge
        # Both set by DRF on the exception, neither declared by its stubs.
        challenge, wait = getattr(exc, "auth_header", None), getattr(exc, "wait", None)
        if challenge:
            headers["WWW-Authenticate"] = challenge
        if isinstance(exc, exceptions.Throttled) and wait is not None:
            headers["Retry-After"] = str(int(-(-wait // 1)))
        fields = flatten(exc.detail) if isinstance(exc.detail, (dict, list)) else {}
        message = _message(fields, str(exc.detail))
        return status_code, error_body(code, message, fields), headers
    return None


def server_error(request, *args, **kwargs) -> JsonResponse:
    """handler500 for the API's paths: even a bug answers in the error shape."""
    return JsonResponse(
        error_body("server_error", "internal error; it has been logged"), status=status.HTTP_500_INTERNAL_SERVER_ERROR
    )


def bad_request(request, exception=None) -> JsonResponse:
    """handler400 for the API's paths: what Django refuses before any view runs, such as a
    body larger than DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB), in the error shape."""
    message = too_big_message() if isinstance(exception, RequestDataTooBig) else "bad request"
    return JsonResponse(error_body("malformed_request", message), status=status.HTTP_400_BAD_REQUEST)


def too_big_message() -> str:
    return f"the body is larger than the {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes allowed"


def page_not_found(request, exception=None) -> JsonResponse:
    return JsonResponse(error_body("not_found", f"no such resource: {request.path}"), status=404)
