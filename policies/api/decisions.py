"""The gateways' endpoints: decisions, batches of decisions, and reservations.

Every answer to "may this request go?" is a 200, allowed or not, degraded or not: the
gateway reads `allowed`. Errors (a 4xx in the one error shape) are for requests that could
not be decided at all.

/decisions and /decisions/batch are `GatewayView`s: DRF views (the schema, and any unusual
request, go through DRF as before) whose common request takes a lean path to the same answer.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from time import perf_counter

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from core import InvalidRequest, ReservationNotFound, ReservationSettled
from core.limiter import acquire_batch
from policies.compile import TENANT_LEVEL, policy_cache

from . import schemas
from .answers import decision_body, decision_headers, explain_rows
from .auth import CanDecide, ServiceTokenAuthentication, TokenUser, bearer_identity
from .errors import conflict, invalid, not_found
from .observe import (
    observe_seconds,
    record,
    record_many,
    record_reservation,
    reservation_opened,
    reservation_settled,
)
from .parsers import FastJSONParser
from .requests import parse_batch, parse_decision, parse_reservation, parse_settlement, read_json

JSON = "application/json"
# The Accept headers for which DRF's content negotiation picks JSONRenderer with no
# parameters (so no `indent`); any other goes through DRF, which may answer 406.
PLAIN_ACCEPTS = (None, "*/*", JSON)
_UNREAD = object()
_RESPONSE_HEADERS: dict[type, dict] = {}


class _Call:
    """What a view's `answer` reads on the lean path in place of DRF's Request: the caller
    (`user`, `auth`: what the permission classes read) and the body (`data`, read on first use)."""

    __slots__ = ("_request", "user", "auth", "_data")

    def __init__(self, request, identity) -> None:
        self._request, self.auth, self._data = request, identity, _UNREAD
        # As DRF does, the Django request's user becomes the caller for what runs after the view.
        self.user = request.user = TokenUser(identity)

    @property
    def data(self):
        if self._data is _UNREAD:
            self._data = read_json(self._request)
        return self._data

    def __getattr__(self, name):
        return getattr(self._request, name)  # as DRF's Request: the rest is the Django request's


class Timed(APIView):
    """A view whose requests are timed into `limiter_decision_seconds{endpoint}`."""

    endpoint = ""

    def dispatch(self, request, *args, **kwargs):
        start = perf_counter()
        try:
            return super().dispatch(request, *args, **kwargs)
        finally:
            observe_seconds(self.endpoint, perf_counter() - start)


class GatewayView(APIView):
    """A gateway endpoint, served by DRF except for its common request: a POST with a
    Bearer token, a JSON body, no query string, and an Accept header that is absent, `*/*`
    or `application/json`. That request skips DRF's per-request machinery (the Request
    wrapper, content negotiation, an instance of every policy class, the throttle loop, the
    Response): it calls the view's same `answer` after the same token check and permission
    classes, reads the body with the same parser, renders with the same renderer and answers
    errors through the same exception handler: the same bytes, header fields and status,
    about 85 us of CPU sooner (bench/http.py's profile).

    Any other request (a session, which needs CSRF; no or another credential; a form; a
    query such as `?format=`; an Accept with parameters) is DRF's, as is every request when
    the view's policy classes are not the ones the lean path stands in for (`lean`)."""

    permission_classes = [CanDecide]
    lean = False  # set by as_view(): whether this view's DRF policies are what the lean path does

    @classmethod
    def as_view(cls, **initkwargs):
        return super().as_view(**{"lean": cls._lean_path_fits(), **initkwargs})

    @classmethod
    def _lean_path_fits(cls) -> bool:
        return (
            list(cls.parser_classes) == [FastJSONParser]
            and list(cls.renderer_classes) == [JSONRenderer]
            and list(cls.authentication_classes)[:1] == [ServiceTokenAuthentication]
            and not cls.throttle_classes
            and cls.versioning_class is None
            and cls.content_negotiation_class is DefaultContentNegotiation
        )

    def answer(self, request) -> tuple[dict, dict]:
        """The body and header fields of a 200 for `request` (`request.data`: the JSON body)."""
        raise NotImplementedError(f"{type(self).__name__}.answer")

    def post(self, request):
        body, headers = self.answer(request)
        return Response(body, headers=headers)

    def dispatch(self, request, *args, **kwargs):
        if not (self.lean and self._takes_lean_path(request, kwargs)):
            return super().dispatch(request, *args, **kwargs)
        self.args, self.kwargs = args, kwargs
        call = None
        try:
            call = _Call(request, self._authenticate(request))
            for permission in self.get_permissions():
                # The call stands in for DRF's Request: it has what permission classes read.
                if not permission.has_permission(call, self):  # type: ignore[arg-type]
                    raise exceptions.PermissionDenied(
                        getattr(permission, "message", None), getattr(permission, "code", None)
                    )
            body, headers = self.answer(call)
        except Exception as exc:
            return self._finalize_lean(self._handle_lean_exception(exc, call or request), call or request)
        # What DRF's Response would become, rendered here: Content-Type, the view's fields, Allow.
        return HttpResponse(
            self.renderer_classes[0]().render(body),
            headers={"Content-Type": JSON, **headers, **self._response_headers()},
        )

    def _takes_lean_path(self, request, kwargs) -> bool:
        meta = request.META
        return (
            request.method == "POST"
            and not meta.get("QUERY_STRING")
            and meta.get("CONTENT_TYPE") == JSON
            and meta.get("HTTP_ACCEPT") in PLAIN_ACCEPTS
            and meta.get("HTTP_AUTHORIZATION", "").partition(" ")[0].lower() == "bearer"
            and self.settings.FORMAT_SUFFIX_KWARG not in kwargs
            # APIClient.force_authenticate: DRF then skips the authenticators.
            and getattr(request, "_force_auth_user", None) is None
            and getattr(request, "_force_auth_token", None) is None
        )

    @staticmethod
    def _authenticate(request):
        try:
            return bearer_identity(request.META["HTTP_AUTHORIZATION"])
        except exceptions.APIException:
            # DRF's unauthenticated caller (UNAUTHENTICATED_USER) becomes the request's user.
            unauthenticated = api_settings.UNAUTHENTICATED_USER
            request.user = unauthenticated() if callable(unauthenticated) else None
            raise

    def _handle_lean_exception(self, exc: Exception, request) -> Response:
        """APIView.handle_exception: the Bearer challenge on a 401, then the exception handler."""
        if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
            # DRF's own attribute (its handle_exception sets it too), which its stubs do not declare.
            exc.auth_header = self.get_authenticators()[0].authenticate_header(request)  # type: ignore[union-attr]
        context = {"view": self, "args": self.args, "kwargs": self.kwargs, "request": request}
        response = self.get_exception_handler()(exc, context)
        if response is None:
            raise exc  # a bug: Django's handler500 answers, as it does after DRF
        response.exception = True
        return response

    def _response_headers(self) -> dict:
        """DRF's default_response_headers (Allow), the same for every request to a view class."""
        found = _RESPONSE_HEADERS.get(type(self))
        if found is None:
            found = _RESPONSE_HEADERS[type(self)] = self.default_response_headers
        return found

    def _finalize_lean(self, response: Response, request) -> Response:
        """APIView.finalize_response for what DRF's negotiation picks here (JSON, no parameters);
        Django renders the response."""
        response.accepted_renderer = self.renderer_classes[0]()
        response.accepted_media_type = JSON
        # Set by DRF's finalize_response too; its stubs do not declare it.
        context = {"view": self, "args": self.args, "kwargs": self.kwargs, "request": request}
        response.renderer_context = context  # type: ignore[attr-defined]
        for key, value in self._response_headers().items():
            response[key] = value
        return response


class DecisionView(Timed, GatewayView):
    endpoint = "decisions"

    @extend_schema(
        request=schemas.DecisionRequest,
        responses={200: schemas.Decision, **schemas.ERRORS},
        summary="May this request go?",
        tags=["decisions"],
        description="Checks every rule at every level named in `keys`, then takes `cost` from "
        "all of them or from none. `dry_run` explains without taking anything.",
    )
    def post(self, request):
        return super().post(request)

    def answer(self, request) -> tuple[dict, dict]:
        cache = policy_cache()
        asked = parse_decision(request.data, cache.current())
        limiter = cache.limiter_for(asked.keys.get(TENANT_LEVEL))
        if asked.dry_run:
            decision, rows = limiter.explain(asked.keys, asked.cost, asked.priority)
            body = {**decision_body(decision), "dry_run": True, "rules": explain_rows(rows)}
        else:
            decision = limiter.acquire(asked.keys, asked.cost, asked.priority)
            record(asked.keys, decision, asked.cost, asked.priority)
            body = decision_body(decision)
        return body, decision_headers(limiter, asked.keys, decision)


class BatchView(Timed, GatewayView):
    endpoint = "batch"

    @extend_schema(
        request=schemas.BatchRequest,
        responses={200: schemas.BatchAnswer, **schemas.ERRORS},
        summary="Many decisions at once",
        tags=["decisions"],
        description="Up to 1,000 requests, answered in order, each as if made one after the "
        "other. On Redis the whole batch is one pipelined round trip.",
    )
    def post(self, request):
        return super().post(request)

    def answer(self, request) -> tuple[dict, dict]:
        cache = policy_cache()
        asked = parse_batch(request.data, cache.current())
        items = [(cache.limiter_for(r.keys.get(TENANT_LEVEL)), r.keys, r.cost, r.priority) for r in asked]
        try:
            decisions = acquire_batch(items)
        except InvalidRequest as error:  # an item's field, named by core as "<index>.<field>"
            if not error.field:
                raise
            raise invalid(f"requests.{error.field}", str(error).split(": ", 1)[-1]) from None
        record_many((r.keys, decision, r.cost, r.priority) for r, decision in zip(asked, decisions))
        return {"decisions": [decision_body(d) for d in decisions]}, {}


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
        cache = policy_cache()
        keys, cost, priority, hold = parse_reservation(request.data, cache.current())
        limiter = cache.limiter_for(keys.get(TENANT_LEVEL))
        decision, reservation = limiter.reserve(keys, cost, priority, hold)
        record_reservation(keys, decision, cost, priority, hold, reservation.id if reservation is not None else None)
        body = {**decision_body(decision), "id": None, "expires_at": None, "cost": cost}
        if reservation is not None:
            # The store's clock may not be the wall clock (in-process: monotonic), so the
            # expiry is reported as now plus what is left of the hold.
            left = reservation.expires_at - reservation.taken_at
            body.update(id=reservation.id, expires_at=_epoch_iso(time.time() + left), hold=left)
            reservation_opened(reservation.id, left)
        status = 201 if decision.allowed else 200
        return Response(body, status=status, headers=decision_headers(limiter, keys, decision))


# A settlement names a reservation that may be unknown or expired (404) or settled (409),
# and reaches the store, which may be down (503).
SETTLE_ERRORS = {**schemas.ERRORS, **schemas.NOT_FOUND, **schemas.CONFLICT, **schemas.UNAVAILABLE}


class SettleView(Timed, APIView):
    permission_classes = [CanDecide]
    commit = True
    endpoint = "commit"

    def post(self, request, reservation_id):
        actual_cost = parse_settlement(request.data, required=self.commit)
        try:
            settlement = policy_cache().settle(reservation_id, actual_cost)
        except ReservationNotFound:
            raise not_found(f"no open reservation {reservation_id!r}: unknown, or expired", "id") from None
        except ReservationSettled:
            raise conflict(f"reservation {reservation_id!r} is already settled", "id") from None
        status = "committed" if self.commit else "cancelled"
        reservation_settled(reservation_id, status, actual_cost)
        return Response(
            {
                "id": reservation_id,
                "status": status,
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
