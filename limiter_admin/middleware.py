"""A database that cannot be reached is a 503, never a 500.

Decisions do not need the database (each worker decides with the last policy it read, and
trusts the tokens it has proved), but everything that reads or writes policies, tokens or
operators' sessions does. The API's views already answer such an error in its one shape
(policies.services.errors.error_body); this middleware does the same for every other page (the admin, the
dashboard), whose error would otherwise be a 500: a page for people, the error shape for
the API's paths, and `Retry-After: 1` on both. A write that failed saved nothing: each runs
in one transaction.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string

from policies.services.errors import error_body

log = logging.getLogger(__name__)

MESSAGE = "the policy database is unreachable; try again"


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, DatabaseError):
            return None
        log.warning("database error on %s %s: %s", request.method, request.path, exception)
        return database_unavailable(request)


def database_unavailable(request: HttpRequest) -> HttpResponse:
    """The 503: in the API's error shape on its paths, else a page that needs no database
    (no session, no admin context)."""
    response: HttpResponse
    if request.path.startswith("/api/"):
        response = JsonResponse(error_body("database_unavailable", MESSAGE), status=503)
    else:
        response = HttpResponse(render_to_string("503.html", {"message": MESSAGE}), status=503)
    response["Retry-After"] = "1"
    return response
