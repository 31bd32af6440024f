"""Project-level views that belong to no app: probes, metrics, and the error pages."""

import sys

from django.db import DatabaseError
from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_safe
from django.views.defaults import bad_request as html_bad_request
from django.views.defaults import page_not_found
from django.views.defaults import server_error as html_server_error

from limiter_admin.middleware import database_unavailable
from policies.metrics import CONTENT_TYPE, metrics_text
from policies.services.health import readiness


@require_safe
def healthz(request):
    """Liveness: the process answers. Readiness (database, store) is /readyz's job."""
    return JsonResponse({"status": "ok"})


@require_safe
def readyz(request):
    """Readiness: the policy database and the limiter's store both answer."""
    checks = readiness()
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse({"status": "ready" if ready else "not ready", **checks}, status=200 if ready else 503)


@require_safe
def metrics(request):
    """Prometheus exposition: decisions by result, level and reason, and more."""
    return HttpResponse(metrics_text(), content_type=CONTENT_TYPE)


def by_path(api_handler, page_handler):
    """A handler400, handler404 or handler500 that answers the API's paths with `api_handler`
    (the error shape) and every other path with `page_handler` (a page). limiter_admin/urls.py
    wires each with the REST API's own handler, so that this module knows no transport."""

    def handler(request, *args, **kwargs):
        # Django calls handler500 inside its `except`: a DatabaseError raised by a middleware
        # (a session saved on the way out) is the database's 503 too, not a bug's 500.
        if page_handler is html_server_error and isinstance(sys.exc_info()[1], DatabaseError):
            return database_unavailable(request)
        chosen = api_handler if request.path.startswith("/api/") else page_handler
        return chosen(request, *args, **kwargs)

    return handler


__all__ = ["by_path", "healthz", "html_bad_request", "html_server_error", "metrics", "page_not_found", "readyz"]
