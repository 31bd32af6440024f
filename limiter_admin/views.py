"""Project-level views that belong to no app: probes, metrics, and the error pages."""
from django.db import DatabaseError, connection
from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_safe
from django.views.defaults import page_not_found, server_error as html_server_error

from core import StoreUnavailable
from policies.api import errors
from policies.api.observe import CONTENT_TYPE_LATEST, metrics_text
from policies.compile import policy_cache


@require_safe
def healthz(request):
    """Liveness: the process answers. Readiness (database, store) is /readyz's job."""
    return JsonResponse({"status": "ok"})


@require_safe
def readyz(request):
    """Readiness: the policy database and the limiter's store both answer."""
    checks = {"database": "ok", "store": "ok"}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as error:
        checks["database"] = f"unreachable: {error}"
    try:
        policy_cache().store.ping()
    except StoreUnavailable as error:
        checks["store"] = f"unreachable: {error}"
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse({"status": "ready" if ready else "not ready", **checks}, status=200 if ready else 503)


@require_safe
def metrics(request):
    """Prometheus exposition: decisions by result, level and reason, and more."""
    return HttpResponse(metrics_text(), content_type=CONTENT_TYPE_LATEST)


def _is_api(request) -> bool:
    return request.path.startswith("/api/")


def not_found(request, exception=None):
    if _is_api(request):
        return errors.page_not_found(request, exception)
    return page_not_found(request, exception)


def server_error(request):
    if _is_api(request):
        return errors.server_error(request)
    return html_server_error(request)
