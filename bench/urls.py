"""The app's URLs plus two bench-only views, served only under bench.settings:

- `bench/bare`: a DRF APIView that answers a constant, the floor that bench/http.py measures
  the decision endpoint against;
- `bench/plain`: a plain Django view that answers the same bytes, no DRF: bench/http.py's
  profile uses it to tell DRF's own cost per request from Django's;
- `bench/open`, `bench/open-async`, and the same under `@limit` (`bench/limited`,
  `bench/limited-async`), with a limit no request reaches: bench/embedding.py's views.
"""

import json

from django.http import HttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from limiter_admin.urls import handler404, handler500  # noqa: F401
from limiter_admin.urls import urlpatterns as app_urlpatterns
from policies.embedding import limit

# An allowed decision's body, as /api/v1/decisions answers it.
ANSWER = {
    "allowed": True,
    "retry_after": 0.0,
    "blocked_by": None,
    "reason": "OK",
    "remaining": 99.0,
    "degraded": False,
    "shadow_blocked": [],
}
ANSWER_BYTES = json.dumps(ANSWER, separators=(",", ":")).encode()


class BareView(APIView):
    """POST with a decision's JSON body; no authentication, no permission check, and the body
    is not read: what DRF, the middleware and the renderer cost, and nothing of ours."""

    authentication_classes = []
    permission_classes = [AllowAny]

    def post(self, request):
        return Response(ANSWER)


@csrf_exempt
def plain(request):
    """The same answer without DRF (APIView's as_view is csrf_exempt too)."""
    return HttpResponse(ANSWER_BYTES, content_type="application/json")


def open_view(request):
    return HttpResponse(b"ok")


async def open_async(request):
    return HttpResponse(b"ok")


NEVER_REACHED = {"rate": 1e9, "burst": 1e12}
limited_view = limit(**NEVER_REACHED)(open_view)
limited_async = limit(**NEVER_REACHED)(open_async)


# Last, so that resolving the app's own paths tries exactly the patterns it does in the app.
urlpatterns = [
    *app_urlpatterns,
    path("bench/bare", BareView.as_view(), name="bench-bare"),
    path("bench/plain", plain, name="bench-plain"),
    path("bench/open", open_view),
    path("bench/open-async", open_async),
    path("bench/limited", limited_view),
    path("bench/limited-async", limited_async),
]
