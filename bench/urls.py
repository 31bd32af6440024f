"""The app's URLs plus `bench/bare`: a DRF view that answers a constant, the floor that
bench/http.py measures the decision endpoint against (served only under bench.settings)."""
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from limiter_admin.urls import handler404, handler500, urlpatterns as app_urlpatterns  # noqa: F401

# An allowed decision's body, as /api/v1/decisions answers it.
ANSWER = {"allowed": True, "retry_after": 0.0, "blocked_by": None, "reason": "OK",
          "remaining": 99.0, "degraded": False, "shadow_blocked": []}


class BareView(APIView):
    """POST with a decision's JSON body; no authentication, no permission check, and the body
    is not read: what DRF, the middleware and the renderer cost, and nothing of ours."""

    authentication_classes = []
    permission_classes = [AllowAny]

    def post(self, request):
        return Response(ANSWER)


# Last, so that resolving the app's own paths tries exactly the patterns it does in the app.
urlpatterns = [*app_urlpatterns, path("bench/bare", BareView.as_view(), name="bench-bare")]
