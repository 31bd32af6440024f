"""The gateways' endpoints: decisions, batches of decisions, and reservations.

Every answer to "may this request go?" is a 200, allowed or not, degraded or not: the
gateway reads `allowed`. Errors (a 4xx in the one error shape) are for requests that could
not be decided at all.

/decisions and /decisions/batch are served on the gateways' request path (`gateway.py`);
reservations and their settlements are DRF views.
"""

from __future__ import annotations

from datetime import UTC, datetime
from time import perf_counter
from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from policies.services import decisions
from policies.services.answers import decision_body, decision_headers, explain_rows
from policies.services.errors import not_found
from policies.services.inputs import parse_settlement
from policies.services.leases import release
from policies.services.recording import observe_seconds

from . import schemas
from .auth import CanDecide
from .gateway import Answer, Call, GatewayView, described


class Timed(APIView):
    """A view whose requests are timed into `limiter_decision_seconds{endpoint}`."""

    endpoint = ""

    def dispatch(self, request, *args, **kwargs):
        start = perf_counter()
        try:
            return super().dispatch(request, *args, **kwargs)
        finally:
            observe_seconds(self.endpoint, perf_counter() - start)


class DecisionView(GatewayView):
    endpoint = "decisions"
    schema = described(
        "Decision",
        post=extend_schema(
            request=schemas.DecisionRequest,
            responses={200: schemas.Decision, **schemas.ERRORS},
            summary="May this request go?",
            tags=["decisions"],
            description="Checks every rule at every level named in `keys`, then takes `cost` from "
            "all of them or from none. `dry_run` explains without taking anything.",
        ),
    )

    def answer(self, call: Call, **kwargs: Any) -> Answer:
        decided = decisions.ask(call.data)
        body = {**decision_body(decided.decision), "lease": decided.ticket}
        if decided.rows is not None:
            body.update(dry_run=True, rules=explain_rows(decided.rows))
        return Answer(body, decision_headers(decided.limiter, decided.keys, decided.decision))


class BatchView(GatewayView):
    endpoint = "batch"
    schema = described(
        "Batch",
        post=extend_schema(
            request=schemas.BatchRequest,
            responses={200: schemas.BatchAnswer, **schemas.ERRORS},
            summary="Many decisions at once",
            tags=["decisions"],
            description="Up to 1,000 requests, answered in order, each as if made one after the "
            "other. On Redis the whole batch is one pipelined round trip.",
        ),
    )

    def answer(self, call: Call, **kwargs: Any) -> Answer:
        decided = decisions.ask_batch(call.data)
        return Answer({"decisions": [{**decision_body(d.decision), "lease": d.ticket} for d in decided]})


class LeaseReleaseView(GatewayView):
    endpoint = "release"
    schema = described(
        "LeaseRelease",
        post=extend_schema(
            request=None,
            responses={200: schemas.LeaseRelease, **schemas.ERRORS, **schemas.NOT_FOUND},
            summary="Hand back a concurrency slot",
            tags=["decisions"],
            description="Frees the slot that a decision's `lease` holds. Once only: a second "
            "release, a release after the lease ran out, or while the store is down (the slot "
            "then comes back when its lease runs out) is a 404.",
        ),
    )

    def answer(self, call: Call, **kwargs: Any) -> Answer:
        lease = kwargs["lease"]
        parse_settlement(call.data, required=False)  # no body, or an empty object
        released = release(lease)
        if not released:
            raise not_found(f"no slot held by lease {lease!r}: unknown, released already, or run out", "id")
        return Answer({"id": lease, "status": "released", "released": released})


def _epoch_iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


class ReservationView(Timed, APIView):
    permission_classes = [CanDecide]
    endpoint = "reservations"

    @extend_schema(
        request=schemas.ReservationRequest,
        responses={
            201: schemas.Reservation,
            200: OpenApiResponse(schemas.Reservation, description="Denied: nothing reserved."),
            **schemas.ERRORS,
        },
        summary="Reserve an estimated cost",
        tags=["reservations"],
        description="Takes `cost` at every level (and any concurrency slots) at once, or nothing. "
        "Settle it with /commit and the actual cost, or /cancel. An unsettled "
        "reservation's slots come back when it expires; its tokens stay spent. "
        "While the store is down a fail mode may allow without a reservation: "
        "then `id` is null and there is nothing to settle.",
    )
    def post(self, request):
        reserved = decisions.ask_reservation(request.data)
        body = {**decision_body(reserved.decision), "id": None, "expires_at": None, "cost": reserved.cost}
        if reserved.id is not None and reserved.expires_at is not None:
            body.update(id=reserved.id, expires_at=_epoch_iso(reserved.expires_at), hold=reserved.hold)
        status = 201 if reserved.decision.allowed else 200
        return Response(
            body, status=status, headers=decision_headers(reserved.limiter, reserved.keys, reserved.decision)
        )


# A settlement names a reservation that may be unknown or expired (404) or settled (409),
# and reaches the store, which may be down (503).
SETTLE_ERRORS = {**schemas.ERRORS, **schemas.NOT_FOUND, **schemas.CONFLICT, **schemas.UNAVAILABLE}


class SettleView(Timed, APIView):
    permission_classes = [CanDecide]
    commit = True
    endpoint = "commit"

    def post(self, request, reservation_id):
        settlement = decisions.settle(reservation_id, request.data, self.commit)
        return Response(
            {
                "id": reservation_id,
                "status": settlement.status,
                "refunded": settlement.refunded,
                "charged": settlement.charged,
                "released": settlement.released,
            }
        )


class CommitView(SettleView):
    @extend_schema(
        request=schemas.CommitRequest,
        responses={200: schemas.Settlement, **SETTLE_ERRORS},
        summary="Settle a reservation with its actual cost",
        tags=["reservations"],
        description="Refunds the estimate's excess, or charges the shortfall (which may put a "
        "rule into debt), and releases concurrency slots. 404 when unknown or "
        "expired; 409 when already settled.",
    )
    def post(self, request, reservation_id):
        return super().post(request, reservation_id)


class CancelView(SettleView):
    commit = False
    endpoint = "cancel"

    @extend_schema(
        request=None,
        responses={200: schemas.Settlement, **SETTLE_ERRORS},
        summary="Cancel a reservation: refund all of it",
        tags=["reservations"],
    )
    def post(self, request, reservation_id):
        return super().post(request, reservation_id)
