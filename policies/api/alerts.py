"""An alert's delivery log and its test send: /api/v1/alerts/{name}/deliveries and
/api/v1/alerts/{name}/test (admin scope). Alerts themselves are policy CRUD (crud.py)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import generics
from rest_framework.response import Response
from rest_framework.views import APIView

from policies.models import Alert, AlertDelivery
from policies.services.alerts import send_test
from policies.services.errors import invalid, not_found

from . import schemas
from . import serializers as shapes
from .auth import IsOperator
from .crud import PolicyPagination

TAGS = ["alerts"]
NAMED = {**schemas.ERRORS, **schemas.NOT_FOUND}


def alert_named(name: str) -> Alert:
    alert = Alert.objects.filter(name=name).first()
    if alert is None:
        raise not_found(f"no alert {name!r}", "name")
    return alert


@extend_schema(
    summary="An alert's delivery log, newest first",
    tags=TAGS,
    responses={200: shapes.DeliverySerializer(many=True), **NAMED},
    description="Each attempt to deliver one of the alert's firings, and each test: when, the receiver's HTTP "
    "status (null when it never answered), the error, how long it took, and what fired.",
)
class AlertDeliveriesView(generics.ListAPIView):
    permission_classes = [IsOperator]
    pagination_class = PolicyPagination
    serializer_class = shapes.DeliverySerializer

    def get_queryset(self):
        alert = alert_named(self.kwargs["name"])
        return AlertDelivery.objects.filter(alert=alert).select_related("firing__alert").order_by("-at", "-id")


@extend_schema(
    summary="Send a test delivery now",
    tags=TAGS,
    request=None,
    responses={
        200: shapes.DeliverySerializer,
        **NAMED,
        503: OpenApiResponse(schemas.Error, description="This worker's deliveries are all busy: try again."),
    },
    description='Posts a test body (`"test": true`, no tenant) to the alert\'s URL, signed as every delivery '
    "is, waits for the receiver (its timeout) and answers how it went, as the log records it: a receiver "
    "that refuses or never answers is still a 200 with `ok: false`. 503 when this worker's deliveries "
    "are all busy.",
)
class AlertTestView(APIView):
    permission_classes = [IsOperator]

    def post(self, request, name: str):
        if request.data:
            raise invalid("", "this call takes no body (or an empty object)")
        delivery = send_test(alert_named(name))
        return Response(shapes.DeliverySerializer(delivery).data)
