"""The console's middleware, which a gateway's call passes straight through.

Sessions, CSRF, the logged-in user, messages, the policy history's request and WhiteNoise's
static files are the console's and CRUD's: a gateway calling
/api/v1/decisions with its Bearer token needs none of them, and on every decision they cost
about a quarter of the request's CPU (docs/BENCHMARKS.md, "The decision path"). Each is listed in
settings.MIDDLEWARE wrapped by `console_only`, in its own place, so the console keeps all of
them in Django's order; a request passes them by when `passes_by` says so:

- its path is a gateway's or a probe's (`admission.GATEWAY_PATHS`, the one list), and
- it carries a Bearer credential, or no cookie at all (a probe, a gateway's call): an
  operator's browser calling a gateway path with its session still has its session, its
  user and its CSRF check.

Only Django's documented middleware interface is used: each wrapper is a subclass of the
middleware it wraps (Django's admin checks for its middleware by subclass) whose `__call__`
and hooks (`process_view`, `process_exception`, `process_template_response`) step aside on
those requests. django-axes' middleware stays as it is: its own check looks for its name, and
it does nothing before the view. Gateway views (policies.api.gateway) are mostly served before
any of this, by limiter_admin/gateway_front.py; this keeps the rest of a gateway's calls (its
reservations, DRF views) light.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils.module_loading import import_string

from .admission import is_gateway_path

HOOKS = ("process_view", "process_exception", "process_template_response")


def passes_by(request: HttpRequest) -> bool:
    """Whether the console's middleware leaves `request` alone (see the module's docstring)."""
    if not is_gateway_path(request.path_info):
        return False
    meta = request.META
    return not meta.get("HTTP_COOKIE") or meta.get("HTTP_AUTHORIZATION", "")[:7].lower() == "bearer "


def console_only(dotted: str) -> Any:
    """The middleware at `dotted`, passed by on the requests `passes_by` names: a subclass of
    a class, so that Django's checks that look for it (the admin's) find it; a factory around
    a function."""
    wrapped: Any = import_string(dotted)
    if not isinstance(wrapped, type):
        return _around_factory(wrapped)
    cls: Any = wrapped  # a class: its own __init__ and __call__, called on the subclass
    init, call = cls.__init__, cls.__call__

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.passed_to = get_response
        init(self, get_response)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if passes_by(request):
            return self.passed_to(request)
        return call(self, request)

    namespace: dict[str, Any] = {
        "__init__": __init__,
        "__call__": __call__,
        "__module__": __name__,
        "__doc__": f"{dotted}, passed by on a gateway's calls (limiter_admin.console_only).",
    }
    for hook in HOOKS:
        if hasattr(wrapped, hook):
            namespace[hook] = _skipping(getattr(wrapped, hook))
    return type(wrapped)(f"ConsoleOnly{wrapped.__name__}", (wrapped,), namespace)


def _around_factory(factory: Callable[..., Any]) -> Callable[..., Any]:
    def middleware_factory(get_response: Callable[[HttpRequest], HttpResponse]) -> Callable[..., Any]:
        inner = factory(get_response)

        def middleware(request: HttpRequest) -> HttpResponse:
            return get_response(request) if passes_by(request) else inner(request)

        return middleware

    middleware_factory.sync_capable, middleware_factory.async_capable = True, False  # type: ignore[attr-defined]
    return middleware_factory


def _skipping(hook: Callable[..., Any]) -> Callable[..., Any]:
    def run(self: Any, request: HttpRequest, *args: Any) -> Any:
        return None if passes_by(request) else hook(self, request, *args)

    return run


# settings.MIDDLEWARE names these, each where the middleware it wraps belongs.
WhiteNoiseMiddleware = console_only("whitenoise.middleware.WhiteNoiseMiddleware")
SessionMiddleware = console_only("django.contrib.sessions.middleware.SessionMiddleware")
CsrfViewMiddleware = console_only("django.middleware.csrf.CsrfViewMiddleware")
AuthenticationMiddleware = console_only("django.contrib.auth.middleware.AuthenticationMiddleware")
MessageMiddleware = console_only("django.contrib.messages.middleware.MessageMiddleware")
HistoryRequestMiddleware = console_only("simple_history.middleware.HistoryRequestMiddleware")
