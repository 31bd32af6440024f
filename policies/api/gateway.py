"""The gateways' request path: one plain Django view that every gateway endpoint is built on
(/decisions, /decisions/batch, /authz, /rls/json).

A gateway endpoint subclasses `GatewayView` and writes `answer(call)`. The path, the same for
all of them: time the request; check the method; authenticate (a Bearer service token, or an
operator's session with its CSRF token); check the scope (a decide or admin token, a staff
session); then `answer`. Whatever it raises is answered in the API's one error shape
(`errors.error_answer`, which DRF's exception handler uses too); a bug goes on to Django's
handler500, which answers in the same shape.

The OpenAPI schema describes each endpoint through a DRF view that never serves (`schema`: an
APIView whose methods carry drf-spectacular's `extend_schema`); `gateway_endpoints`, a
drf-spectacular preprocessing hook, puts it among the endpoints at the gateway view's path.
"""

from __future__ import annotations

from collections.abc import Iterator
from time import perf_counter
from typing import Any, ClassVar

from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver, get_resolver
from django.views import View
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from drf_spectacular.generators import EndpointEnumerator
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer
from rest_framework.views import APIView

from policies.services.auth import BEARER_CHALLENGE, DECIDING_SCOPES, bearer_identity
from policies.services.recording import observe_seconds

from .auth import CanDecide, TokenUser, scope_of
from .errors import error_answer
from .parsers import read_json

JSON = "application/json"
# Media ranges under which a JSON answer is acceptable (parameters aside).
_ACCEPTS_JSON = frozenset(("*/*", "application/*", JSON))
_UNREAD = object()
_RENDERER = JSONRenderer()
_ALLOW: dict[type, str] = {}  # each view class's Allow field


class Call:
    """One gateway request as `answer` reads it: the Django request, the caller (`auth`: the
    token's identity, None for a session; `user`) and the JSON body (`data`, read on first use)."""

    __slots__ = ("request", "auth", "user", "_data")

    def __init__(self, request: HttpRequest, auth, user) -> None:
        self.request, self.auth, self.user, self._data = request, auth, user, _UNREAD

    @property
    def data(self) -> Any:
        if self._data is _UNREAD:
            self._data = read_json(self.request)
        return self._data


class Answer:
    """What `answer` gives back: a status, a JSON body (None: no body) and header fields."""

    __slots__ = ("status", "body", "headers")

    def __init__(self, body: Any, headers: dict | None = None, status: int = 200) -> None:
        self.status, self.body, self.headers = status, body, headers or {}


class GatewayView(View):
    """A gateway endpoint: set `methods`, `endpoint` (its label in limiter_decision_seconds),
    `schema` (the DRF view that describes it) and write `answer`."""

    methods: ClassVar[tuple[str, ...]] = ("POST",)
    endpoint: ClassVar[str] = ""
    schema: ClassVar[type[APIView] | None] = None
    # Whether the Accept header must admit JSON (406 otherwise); forward-auth answers any Accept.
    negotiate: ClassVar[bool] = True
    # Whether a body must be JSON (415 otherwise): false for endpoints that read no body.
    reads_json: ClassVar[bool] = True
    # limiter_admin.gateway_front may answer a gateway's call to it without Django's handler.
    served_directly: ClassVar[bool] = True

    @classmethod
    def as_view(cls, **initkwargs: Any):
        # Token calls need no CSRF token; a session's call is checked in `caller`.
        return csrf_exempt(super().as_view(**initkwargs))

    def answer(self, call: Call, **kwargs: Any) -> Answer:
        raise NotImplementedError(f"{type(self).__name__}.answer")

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method == "OPTIONS" and "OPTIONS" not in self.methods:  # a CORS preflight: no credentials
            return self.respond(Answer(None))
        start = perf_counter()
        try:
            try:
                answer = self.answer(self.caller(request), **kwargs)
            except Exception as exc:
                found = error_answer(exc)
                if found is None:
                    raise  # a bug: Django's handler500 answers, in the error shape
                status, body, headers = found
                if status == 401:
                    headers["WWW-Authenticate"] = BEARER_CHALLENGE
                answer = Answer(body, headers, status)
            return self.respond(answer)
        finally:
            observe_seconds(self.endpoint, perf_counter() - start)

    def respond(self, answer: Answer) -> HttpResponse:
        if answer.body is None:
            content, headers = b"", {**answer.headers, "Allow": self.allow()}
        else:
            content = _RENDERER.render(answer.body)
            headers = {"Content-Type": JSON, **answer.headers, "Allow": self.allow()}
        return HttpResponse(content, status=answer.status, headers=headers)

    @classmethod
    def allow(cls) -> str:
        found = _ALLOW.get(cls)
        if found is None:
            found = _ALLOW[cls] = ", ".join(dict.fromkeys((*cls.methods, "OPTIONS")))
        return found

    def caller(self, request: HttpRequest) -> Call:
        """The checks before `answer`, in this order: method, credentials (CSRF for a session),
        scope, Accept, Content-Type."""
        method = request.method or ""
        if method not in self.methods:
            raise exceptions.MethodNotAllowed(method)
        identity = bearer_identity(request.META.get("HTTP_AUTHORIZATION", ""))
        if identity is not None:
            # As DRF does, the Django request's user becomes the caller for what runs after the view.
            user: Any = TokenUser(identity)
            request.user = user
        else:
            user = getattr(request, "user", None)  # the session's (AuthenticationMiddleware)
            if user is None or not user.is_authenticated or not user.is_active:
                raise exceptions.NotAuthenticated()
            if csrf_protect(_passed)(request) is not None:
                raise exceptions.PermissionDenied("CSRF Failed: a session's call needs its CSRF token.")
        call = Call(request, identity, user)
        if scope_of(call) not in DECIDING_SCOPES:
            raise exceptions.PermissionDenied(CanDecide.message)
        if self.negotiate and not _accepts_json(request.META.get("HTTP_ACCEPT")):
            raise exceptions.NotAcceptable()
        if self.reads_json and request.META.get("CONTENT_LENGTH") not in (None, "", "0"):
            if request.content_type != JSON:
                raise exceptions.UnsupportedMediaType(request.content_type or "")
        return call


def _passed(request: HttpRequest) -> None:
    """What csrf_protect wraps: None when the CSRF check passes (its refusal is a response)."""
    return None


def _accepts_json(accept: str | None) -> bool:
    if not accept:
        return True
    return any(part.split(";", 1)[0].strip() in _ACCEPTS_JSON for part in accept.split(","))


# The schema -------------------------------------------------------------------------------------


def described(name: str, **methods: Any) -> type[APIView]:
    """A DRF view that describes a gateway endpoint to drf-spectacular and never serves:
    `methods` maps a method name (`post`) to its extend_schema decorator."""

    def never_served():
        def handler(self, request, *args, **kwargs):
            raise exceptions.NotFound()  # the gateway view serves the path; this class describes it

        return handler  # one function per method: extend_schema marks the function it decorates

    attrs: dict[str, Any] = {"permission_classes": [CanDecide], "__module__": __name__}
    for method, decorate in methods.items():
        attrs[method] = decorate(never_served())
    return type(name, (APIView,), attrs)


def gateway_endpoints(endpoints: list, **kwargs: Any) -> list:
    """drf-spectacular's PREPROCESSING_HOOKS: the gateway views, which are not DRF views, as
    the DRF views that describe them (`GatewayView.schema`), at their own paths."""
    enumerator = EndpointEnumerator()
    found = list(endpoints)
    for path_regex, schema in _gateway_views(get_resolver().url_patterns, ""):
        callback = schema.as_view()
        path = enumerator.get_path_from_regex(path_regex)
        for method in enumerator.get_allowed_methods(callback):
            found.append((path, path_regex, method, callback))
    return found


def _gateway_views(patterns: list, prefix: str) -> Iterator[tuple[str, type[APIView]]]:
    """(path regex, describing view) of every URL pattern served by a described GatewayView
    (its `schema`, or the one its as_view() was given)."""
    for pattern in patterns:
        regex = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _gateway_views(pattern.url_patterns, regex)
        elif isinstance(pattern, URLPattern):
            # Django's View.as_view() sets both on the view function.
            view_class = getattr(pattern.callback, "view_class", None)
            if isinstance(view_class, type) and issubclass(view_class, GatewayView):
                schema = getattr(pattern.callback, "view_initkwargs", {}).get("schema", view_class.schema)
                if schema is not None:
                    yield regex, schema
