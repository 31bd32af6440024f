"""A gateway's call, served by its view without the rest of Django's request handling.

The one bypass of the decision path (docs/ARCHITECTURE.md). Django's handler does on every
request what a gateway's decision does not need: it sends `request_started` and
`request_finished` (whose receivers look at every database connection and cache), resolves
the URL through the whole URLconf, and passes the request through each middleware in
settings.MIDDLEWARE, the console's included (which limiter_admin.console_only passes by, but
each layer still costs its call). In one process that came to about two thirds of a
decision's CPU (docs/BENCHMARKS.md, "The decision path").

`GatewayFront` wraps the WSGI application (limiter_admin/wsgi.py). A request that
console_only.passes_by names (a gateway path with a Bearer token, or no cookie), whose path
resolves to one of the gateways' views (`served_directly`: policies.api.gateway.GatewayView's /decisions,
/decisions/batch, /authz, /rls/json, a lease's release), is answered by that view wrapped in
the middleware that is not the console's, built by Django's own classes as its handler builds
them (`settings.MIDDLEWARE` minus the console_only wrappers and the console's admission, in
its order, each exception turned into its answer by Django's `convert_exception_to_response`,
so that a bug is the API's 500 and a database error its 503, as through the handler).

A call without a cookie (a gateway's, with its Bearer token) goes through less still: the hooks
of the middleware that acts on such a call (`RUN`: the security, common and clickjacking
middleware's `process_request` and `process_response`, Django's own methods) around the view,
and nothing of the middleware that leaves it alone (`LEFT_OUT`, each with the reason). When
settings.MIDDLEWARE has a middleware in neither list, every call takes the whole chain. The
database's connections are closed by `request_finished` when one had an error or is past
CONN_MAX_AGE, as the handler's signal would have closed it. Anything else goes
to Django's handler unchanged, and so does a call whose Host is not allowed (Django answers
it).

tests/api/test_gateway_front.py pins it: the same requests (allowed, denied, dry runs,
batches, bad bodies, bad tokens, wrong methods, forward-auth, a release) answered through it
and through Django's handler alone give the same status, header fields and body.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.core.handlers.exception import convert_exception_to_response, response_for_exception
from django.core.handlers.wsgi import WSGIRequest
from django.core.signals import request_finished
from django.db import connections
from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, ResolverMatch, resolve
from django.utils.module_loading import import_string

from .admission import is_gateway_path
from .console_only import passes_by

# Where the console's own middleware is, which a gateway's call passes by anyway.
CONSOLE_MIDDLEWARE = ("limiter_admin.console_only.", "limiter_admin.admission.")
MAX_RESOLVED = 64  # gateway paths without parameters whose resolution is kept

# A call without a cookie to a gateway view: the middleware whose hooks act on it, run as
# Django's MiddlewareMixin runs them, and the middleware that leaves it alone, and why.
RUN = (
    "django.middleware.security.SecurityMiddleware",  # an https redirect; its security header fields
    "django.middleware.common.CommonMiddleware",  # refused user agents, PREPEND_WWW; Content-Length
    "django.middleware.clickjacking.XFrameOptionsMiddleware",  # X-Frame-Options
)
LEFT_OUT = {
    "limiter_admin.middleware.DatabaseUnavailableMiddleware": (
        "has no hook but process_exception, which only Django's handler calls, around a view it"
        " dispatches; a gateway view answers a database error itself (its 503)"
    ),
    "django.contrib.sessions.middleware.SessionMiddleware": (
        "without a cookie there is no session to read, and a gateway view opens none"
    ),
    "django.middleware.csrf.CsrfViewMiddleware": (
        "the gateway views are csrf_exempt, and without a cookie there is no CSRF cookie to read or renew"
    ),
    "axes.middleware.AxesMiddleware": "answers a locked-out login, and a gateway view is no login",
}


class GatewayFront:
    """WSGI middleware: a gateway's call to a gateway view, served directly (see the module's
    docstring); every other request to `application`, Django's."""

    def __init__(self, application: Callable[..., Iterable[bytes]]) -> None:
        self.application = application
        self._resolved: dict[str, ResolverMatch | None] = {}
        # How a gateway view's answer is wrapped: in the whole chain, and (a call without a
        # cookie) in the middleware's hooks alone, or the whole chain when direct_path says no.
        self._chain = whole_chain()
        self._direct = direct_path() or self._chain

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if not is_gateway_path(path):
            return self.application(environ, start_response)
        match = self.resolved(path)
        if match is None:
            return self.application(environ, start_response)
        request = WSGIRequest(environ)
        if not passes_by(request) or not self.allowed_host(request):
            return self.application(environ, start_response)
        request.resolver_match = match
        try:
            response = (self._chain if "HTTP_COOKIE" in environ else self._direct)(request)
        finally:
            self.finished()
        headers = [*response.items(), *(("Set-Cookie", c.output(header="")) for c in response.cookies.values())]
        start_response(f"{response.status_code} {response.reason_phrase}", headers)
        return [response.content]

    def resolved(self, path: str) -> ResolverMatch | None:
        """The gateway view that serves `path`, or None (another view, or none)."""
        if path in self._resolved:
            return self._resolved[path]
        try:
            match = resolve(path)
        except Resolver404:
            return None
        # policies.api.gateway.GatewayView says so of itself (this module knows no REST view).
        found = match if getattr(getattr(match.func, "view_class", None), "served_directly", False) else None
        if not match.args and not match.kwargs and len(self._resolved) < MAX_RESOLVED:
            self._resolved[path] = found  # a lease's release names the lease: resolved each time
        return found

    def finished(self) -> None:
        """`request_finished`, whose receivers close a database connection that has had an
        error or outlived CONN_MAX_AGE, sent when an open connection is one of those: most
        calls use none (a token is looked up once a minute), and sending the signal on every
        call is much of what this saves."""
        for conn in connections.all(initialized_only=True):
            if conn.connection is not None and (
                conn.errors_occurred or (conn.close_at is not None and time.monotonic() >= conn.close_at)
            ):
                request_finished.send(sender=self.__class__)
                return

    @staticmethod
    def allowed_host(request: HttpRequest) -> bool:
        try:
            request.get_host()
        except DisallowedHost:
            return False
        return True


def answer(request: HttpRequest) -> HttpResponse:
    """The gateway view that GatewayFront resolved for `request` (its resolver_match), called."""
    match = request.resolver_match
    assert match is not None  # set by GatewayFront.__call__
    return match.func(request, *match.args, **match.kwargs)


def whole_chain() -> Callable[[HttpRequest], Any]:
    """`answer` inside the middleware that is not the console's, as Django's handler builds the
    chain (BaseHandler.load_middleware, for the middleware used here: they hook no view)."""
    handler = convert_exception_to_response(answer)
    for dotted in reversed(settings.MIDDLEWARE):
        if dotted.startswith(CONSOLE_MIDDLEWARE):
            continue
        handler = convert_exception_to_response(import_string(dotted)(handler))
    return handler


def direct_path() -> Callable[[HttpRequest], Any] | None:
    """How a call without a cookie is answered: its view (the request's resolver_match) between
    the hooks of the middleware in RUN, in settings.MIDDLEWARE's order, as MiddlewareMixin runs
    them (a process_request that answers skips the view and the hooks inside it). None when a
    middleware other than the console's is in neither RUN nor LEFT_OUT: the whole chain then."""
    named = [dotted for dotted in settings.MIDDLEWARE if not dotted.startswith(CONSOLE_MIDDLEWARE)]
    if any(dotted not in RUN and dotted not in LEFT_OUT for dotted in named):
        return None

    def never_called(request: HttpRequest) -> HttpResponse:
        raise AssertionError("the direct path calls the middleware's hooks, never its get_response")

    layers = [import_string(dotted)(never_called) for dotted in named if dotted in RUN]
    before = [(at, layer.process_request) for at, layer in enumerate(layers) if hasattr(layer, "process_request")]
    after = [(at, layer.process_response) for at, layer in enumerate(layers) if hasattr(layer, "process_response")]
    after.reverse()

    def through(request: HttpRequest) -> Any:
        # As the chain's layers, each inside Django's convert_exception_to_response: a hook that
        # raises is answered at its layer, and only the layers outside it see that answer.
        depth, response = len(layers), None
        for at, process_request in before:
            try:
                response = process_request(request)
            except Exception as exc:
                depth, response = at, response_for_exception(request, exc)
                break
            if response is not None:
                depth = at + 1  # this middleware's response hook and those outside it
                break
        if response is None:
            response = answered(request)
        for at, process_response in after:
            if at < depth:
                try:
                    response = process_response(request, response)
                except Exception as exc:
                    response = response_for_exception(request, exc)
        return response

    answered = convert_exception_to_response(answer)
    return through
