"""The console's middleware, which a gateway's call passes straight through.

Sessions, CSRF, the logged-in user, messages, the policy history's request, django-axes'
lockouts and WhiteNoise's static files are the console's and CRUD's: a gateway calling
/api/v1/decisions with its Bearer token needs none of them, and on every decision they cost
about a quarter of the request's CPU (docs/BENCHMARKS.md, "The decision path"). Each is listed in
settings.MIDDLEWARE wrapped by `console_only`, in its own place, so the console keeps all of
them in Django's order; a request passes them by when `passes_by` says so:

- its path is a gateway's or a probe's (`admission.GATEWAY_PATHS`, the one list), and
- it carries a Bearer credential, or no cookie at all (a probe, a gateway's call): an
  operator's browser calling a gateway path with its session still has its session, its
  user and its CSRF check.

Only Django's documented middleware interface is used: a middleware factory that holds the
wrapped one, and the hooks (`process_view`, `process_exception`, `process_template_response`)
that the wrapped one has, skipped on the same requests.
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


def console_only(dotted: str) -> type:
    """The middleware at `dotted`, passed by on the requests `passes_by` names."""
    wrapped = import_string(dotted)

    class ConsoleOnly:
        sync_capable, async_capable = True, False

        def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
            self.get_response = get_response
            self.inner = wrapped(get_response)
            for hook in HOOKS:
                method = getattr(self.inner, hook, None)
                if method is not None:
                    setattr(self, hook, _skipping(method))

        def __call__(self, request: HttpRequest) -> HttpResponse:
            if passes_by(request):
                return self.get_response(request)
            return self.inner(request)

    ConsoleOnly.__name__ = ConsoleOnly.__qualname__ = f"ConsoleOnly{wrapped.__name__}"
    ConsoleOnly.__doc__ = f"{dotted}, passed by on a gateway's calls (limiter_admin.console_only)."
    return ConsoleOnly


def _skipping(hook: Callable[..., Any]) -> Callable[..., Any]:
    def run(request: HttpRequest, *args: Any) -> Any:
        return None if passes_by(request) else hook(request, *args)

    return run


# settings.MIDDLEWARE names these, each where the middleware it wraps belongs.
WhiteNoiseMiddleware = console_only("whitenoise.middleware.WhiteNoiseMiddleware")
SessionMiddleware = console_only("django.contrib.sessions.middleware.SessionMiddleware")
CsrfViewMiddleware = console_only("django.middleware.csrf.CsrfViewMiddleware")
AuthenticationMiddleware = console_only("django.contrib.auth.middleware.AuthenticationMiddleware")
MessageMiddleware = console_only("django.contrib.messages.middleware.MessageMiddleware")
HistoryRequestMiddleware = console_only("simple_history.middleware.HistoryRequestMiddleware")
AxesMiddleware = console_only("axes.middleware.AxesMiddleware")
