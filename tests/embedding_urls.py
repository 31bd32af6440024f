"""The app's URLs plus the views the embedded limiter's end-to-end tests flood, served only
under tests.embedding_settings: a decorated sync view, a decorated async view, a DRF view
with the limiter's throttle, and an unprotected async view that answers at once."""

import os

from django.http import JsonResponse
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from limiter_admin.urls import handler404, handler500  # noqa: F401
from limiter_admin.urls import urlpatterns as app_urlpatterns
from policies.embedding import limit
from policies.throttling import LimiterThrottle

LIMIT = 30  # what each limited view lets through, ever (a bucket that never refills)
RULES = [{"type": "token_bucket", "capacity": LIMIT, "per_second": 0}]


def denied(request):
    """A denial with the worker's pid beside the API's error shape: which worker said no."""
    body = {"error": {"code": "rate_limited", "message": "", "fields": {}}, "pid": os.getpid()}
    return JsonResponse(body, status=429)


@limit(rules=RULES, denied_view=denied)
def sync_view(request):
    return JsonResponse({"pid": os.getpid(), "remaining": request.limit.remaining})


@limit(rules=RULES, denied_view=denied)
async def async_view(request):
    return JsonResponse({"pid": os.getpid(), "remaining": request.limit.remaining})


class ThrottledView(APIView):
    authentication_classes = []
    permission_classes = [AllowAny]
    throttle_classes = [LimiterThrottle]

    def get(self, request):
        return Response({"pid": os.getpid(), "remaining": request.limit.remaining})

    def handle_exception(self, exc):
        response = super().handle_exception(exc)  # the 429 in the API's error shape
        response.data["pid"] = os.getpid()  # and which worker said no
        return response


async def ping(request):
    return JsonResponse({"pid": os.getpid()})


urlpatterns = [
    *app_urlpatterns,
    path("embedded/sync", sync_view),
    path("embedded/async", async_view),
    path("embedded/drf", ThrottledView.as_view()),
    path("embedded/ping", ping),
]
