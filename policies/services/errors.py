"""The service layer's errors, and the one error shape of every HTTP answer.

A service raises one of these on purpose; each transport maps them once: the REST API in
policies/api/errors.py (a status and the error shape), the gRPC service in
policies/rls_service.py (a status code), the console as a form error or a message, a
management command as a CommandError. `field` names the bad input as a dotted path
(`requests.3.cost`); `reason` says what is wrong there; `str()` gives both.
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base class of every error the service layer raises on purpose."""

    code = "error"

    def __init__(self, reason: str, field: str = "") -> None:
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}" if field else reason)

    @property
    def fields(self) -> dict[str, str]:
        """{field: reason}, or {} when no one field is to blame."""
        return {self.field: self.reason} if self.field else {}

    @property
    def message(self) -> str:
        """What an answer's message says: the reason (the field is in `fields`)."""
        return self.reason


class Invalid(ServiceError):
    """The caller asked for something that cannot be done as asked: a bad field."""

    code = "invalid"

    @property
    def message(self) -> str:
        return str(self)  # "field: reason", so that a log line alone says where


class NotFound(ServiceError):
    """What the caller named does not exist (or no longer does)."""

    code = "not_found"


class Conflict(ServiceError):
    """The request clashes with what is stored: settled already, changed since read."""

    code = "conflict"


class Unauthenticated(ServiceError):
    """The caller's credentials are missing, malformed, unknown or revoked."""

    code = "authentication_failed"


class Forbidden(ServiceError):
    """The caller is known but may not do this."""

    code = "permission_denied"


class Busy(ServiceError):
    """Not now: a bounded queue is full. Try again after `retry_after` seconds."""

    code = "busy"

    def __init__(self, reason: str, retry_after: float = 1.0) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


def invalid(field: str, reason: str) -> Invalid:
    return Invalid(reason, field)


def not_found(reason: str, field: str = "") -> NotFound:
    return NotFound(reason, field)


def conflict(reason: str, field: str = "") -> Conflict:
    return Conflict(reason, field)


def error_body(code: str, message: str, fields: dict | None = None) -> dict:
    """The one error shape: `{"error": {"code", "message", "fields"}}`, for the REST API, the
    gateway paths and the project's own error pages on API paths."""
    return {"error": {"code": code, "message": message, "fields": fields or {}}}
