"""The console's middleware stays off a gateway's calls (limiter_admin.console_only): a
gateway path with a Bearer token, or without any cookie, is served without sessions, CSRF,
messages or the logged-in user; the console, and an operator's session calling a gateway
path, keep every one of them."""

import pytest
from django.conf import settings
from django.http import HttpResponse
from django.test import RequestFactory

from limiter_admin.console_only import console_only, passes_by

SESSION = settings.SESSION_COOKIE_NAME


@pytest.mark.parametrize(
    "path, headers, passed_by",
    [
        ("/api/v1/decisions", {"HTTP_AUTHORIZATION": "Bearer abc"}, True),
        ("/api/v1/decisions", {"HTTP_AUTHORIZATION": "bearer abc", "HTTP_COOKIE": f"{SESSION}=x"}, True),
        ("/api/v1/decisions/batch", {}, True),  # no credentials, no cookie: refused by the view
        ("/api/v1/authz", {"HTTP_AUTHORIZATION": "Bearer abc"}, True),
        ("/healthz", {}, True),
        ("/api/v1/decisions", {"HTTP_COOKIE": f"{SESSION}=x"}, False),  # an operator's session
        ("/api/v1/decisions", {"HTTP_COOKIE": f"{SESSION}=x", "HTTP_AUTHORIZATION": "Basic eA=="}, False),
        ("/api/v1/tiers", {"HTTP_AUTHORIZATION": "Bearer abc"}, False),  # CRUD keeps everything
        ("/admin/", {}, False),
        ("/admin/login/", {"HTTP_AUTHORIZATION": "Bearer abc"}, False),
    ],
)
def test_only_a_gateways_calls_pass_the_console_middleware_by(path, headers, passed_by):
    assert passes_by(RequestFactory().post(path, **headers)) is passed_by


def test_a_wrapped_middleware_runs_and_hooks_as_itself_off_the_gateway_paths(db):
    seen = []

    def view(request):
        seen.append(hasattr(request, "session"))
        return HttpResponse("ok")

    sessions = console_only("django.contrib.sessions.middleware.SessionMiddleware")(view)
    csrf = console_only("django.middleware.csrf.CsrfViewMiddleware")(view)
    factory = RequestFactory()
    sessions(factory.post("/api/v1/decisions", HTTP_AUTHORIZATION="Bearer abc"))
    sessions(factory.get("/admin/"))
    assert seen == [False, True]
    # CSRF's process_view refuses a console POST without its token, and leaves a gateway's alone.
    refused = csrf.process_view(factory.post("/admin/logout/"), view, (), {})
    assert refused is not None and refused.status_code == 403
    assert csrf.process_view(factory.post("/api/v1/decisions", HTTP_AUTHORIZATION="Bearer a"), view, (), {}) is None


def test_a_gateways_answer_carries_no_session_and_keeps_the_security_headers(api, decide_client):
    response = decide_client.post("/api/v1/decisions", {"keys": {"team": "acme"}}, format="json")
    assert response.status_code == 200
    assert "Vary" not in response or "Cookie" not in response["Vary"]
    assert not response.cookies
    assert response["X-Frame-Options"] == "DENY" and response["X-Content-Type-Options"] == "nosniff"


def test_an_operators_session_still_decides_with_its_csrf_token(api, client, django_user_model):
    operator = django_user_model.objects.create_superuser("op", password="pw-for-tests")
    client.force_login(operator)
    client.get("/admin/")  # the CSRF cookie
    body = '{"keys": {"team": "acme"}}'
    client.handler.enforce_csrf_checks = True
    refused = client.post("/api/v1/decisions", body, content_type="application/json")
    assert refused.status_code == 403, refused.content
    token = client.cookies[settings.CSRF_COOKIE_NAME].value
    allowed = client.post("/api/v1/decisions", body, content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert allowed.status_code == 200 and allowed.json()["allowed"] is True
