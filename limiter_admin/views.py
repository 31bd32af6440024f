"""Project-level views that belong to no app."""
from django.http import JsonResponse
from django.views.decorators.http import require_safe


@require_safe
def healthz(request):
    """Liveness: the process answers. Readiness (database, store) is /readyz's job."""
    return JsonResponse({"status": "ok"})
