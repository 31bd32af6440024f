"""Project-level views that belong to no app: probes, metrics, and the error pages."""

import sys

from django.db import DatabaseError
from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_safe
from django.views.defaults import bad_request as html_bad_request
from django.views.defaults import page_not_found
from django.views.defaults import server_error as html_server_error

from core import StoreUnavailable
from limiter_admin.middleware import database_unavailable
from policies.api import errors
from policies.api.observe import CONTENT_TYPE_LATEST, metrics_text
from policies.compile import policy_cache
from policies.signals import current_version


@require_safe
def healthz(request):
    """Liveness: the process answers. Readiness (database, store) is /readyz's job."""
    return JsonResponse({"status": "ok"})


@require_safe
def readyz(request):
    """Readiness: the policy database and the limiter's store both answer."""
    checks = {"database": "ok", "store": "ok"}
    try:
        # A read of what workers poll, not `SELECT 1`: SQLite answers that without
        # opening its file, so an unreadable database would pass.
        current_version()
    except DatabaseError as error:
        checks["database"] = f"unreachable: {error}"
    store = policy_cache().store
    try:
        store.ping()
    except StoreUnavailable as error:
        down = ", ".join(part["name"] for part in store.health() if part["state"] != "up")
        checks["store"] = f"unreachable: {error}" + (f" (down: {down})" if down else "")
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse({"status": "ready" if ready else "not ready", **checks}, status=200 if ready else 503)


@require_safe
def metrics(request):
    """Prometheus exposition: decisions by result, level and reason, and more."""
    return HttpResponse(metrics_text(), content_type=CONTENT_TYPE_LATEST)


def _is_api(request) -> bool:
    return request.path.startswith("/api/")


def bad_request(request, exception=None):
    if _is_api(request):
        return errors.bad_request(request, exception)
    return html_bad_request(request, exception)


def not_found(request, exception=None):
    if _is_api(request):
        return errors.page_not_found(request, exception)
    return page_not_found(request, exception)


def server_error(request):
    # Django calls this inside its `except`: a DatabaseError raised by a middleware (a
    # session saved on the way out) is the database's 503 too, not a bug's 500.
    if isinstance(sys.exc_info()[1], DatabaseError):
        return database_unavailable(request)
    if _is_api(request):
        return errors.server_error(request)
    return html_server_error(request)
