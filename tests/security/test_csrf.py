"""CSRF: a browser that is logged in to the console sends its session cookie to any site's
form. Every unsafe call made with a session, the admin's forms and the API's writes alike,
needs the CSRF token that only the console's own pages hold; calls with a Bearer token need
none, since a browser never adds that header by itself."""

import re

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from rest_framework.test import APIClient

from policies.models import Tenant, Tier
from tests.policies.test_admin import tier_form

from .conftest import OPERATOR_PASSWORD, make_token

ACME = {"user": "u1", "team": "acme", "global": "*"}
BUCKET = {"type": "token_bucket", "capacity": 5, "per_second": 1}
UNSAFE_API_CALLS = [
    ("post", "/api/v1/decisions", {"keys": ACME}),
    ("post", "/api/v1/decisions/batch", {"requests": [{"keys": ACME}]}),
    (
        "post",
        "/api/v1/rls/json",
        {"domain": "limiter", "descriptors": [{"entries": [{"key": "team", "value": "acme"}]}]},
    ),
    ("post", "/api/v1/reservations", {"keys": ACME, "cost": 1}),
    ("post", "/api/v1/tiers", {"name": "gold", "rules": {"user": [BUCKET]}}),
    ("patch", "/api/v1/tiers/pro", {"version": 1, "rules": {"team": [BUCKET]}}),
    ("put", "/api/v1/settings", {"default_tier": "pro"}),
    ("delete", "/api/v1/tenants/acme", None),
]
IDS = [f"{method.upper()} {url}" for method, url, _ in UNSAFE_API_CALLS]


@pytest.fixture
def browser(loaded, operator):
    """The operator's browser: logged in, and checked for CSRF as Django checks a browser."""
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(operator)
    return client


def csrf_cookie(client) -> str:
    """The CSRF cookie the console's pages set, as a page's script would read it."""
    client.get("/admin/")
    return client.cookies["csrftoken"].value


def form_token(html: str) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)


def call(client, method, url, body, **headers):
    return getattr(client, method)(url, body, format="json", **headers)


# --- the API, with a session ---------------------------------------------------------------


@pytest.mark.parametrize("method, url, body", UNSAFE_API_CALLS, ids=IDS)
def test_a_session_call_that_changes_something_without_the_csrf_token_is_a_403(browser, method, url, body):
    tiers = list(Tier.objects.values_list("name", "version"))
    response = call(browser, method, url, body)
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "permission_denied" and "CSRF" in error["message"]
    assert list(Tier.objects.values_list("name", "version")) == tiers


@pytest.mark.parametrize("method, url, body", UNSAFE_API_CALLS, ids=IDS)
def test_the_same_call_with_the_csrf_token_of_the_consoles_cookie_goes_through(browser, method, url, body):
    token = csrf_cookie(browser)
    response = call(browser, method, url, body, HTTP_X_CSRFTOKEN=token)
    assert 200 <= response.status_code < 300, response.content


def test_a_csrf_token_that_is_not_the_cookies_is_a_403(browser):
    csrf_cookie(browser)
    response = call(browser, "post", "/api/v1/decisions", {"keys": ACME}, HTTP_X_CSRFTOKEN="x" * 32)
    assert response.status_code == 403


def test_a_call_from_another_origin_is_a_403_even_with_the_token(browser):
    token = csrf_cookie(browser)
    response = call(
        browser, "post", "/api/v1/decisions", {"keys": ACME}, HTTP_X_CSRFTOKEN=token, HTTP_ORIGIN="https://evil.example"
    )
    assert response.status_code == 403


def test_a_session_may_read_without_the_csrf_token(browser):
    assert browser.get("/api/v1/tiers").status_code == 200


@pytest.mark.parametrize("method, url, body", UNSAFE_API_CALLS, ids=IDS)
def test_a_token_call_needs_no_csrf_token(loaded, method, url, body):
    client = APIClient(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {make_token('admin', 'ops')}")
    response = call(client, method, url, body)
    assert 200 <= response.status_code < 300, response.content


def test_a_bad_token_is_a_401_even_beside_a_good_session(browser):
    """A request that carries a Bearer token is judged by it alone, never by the cookie too."""
    token = csrf_cookie(browser)
    response = call(
        browser,
        "post",
        "/api/v1/decisions",
        {"keys": ACME},
        HTTP_X_CSRFTOKEN=token,
        HTTP_AUTHORIZATION="Bearer la_000000000000_not-a-token",
    )
    assert response.status_code == 401


# --- the admin's forms ---------------------------------------------------------------------


@pytest.fixture
def console(loaded, operator):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    return client


def test_a_tier_change_posted_without_the_csrf_token_is_a_403_and_changes_nothing(console):
    pro = Tier.objects.get(name="pro")
    response = console.post(f"/admin/policies/tier/{pro.pk}/change/", tier_form(pro, name="platinum"))
    assert response.status_code == 403
    assert Tier.objects.get(pk=pro.pk).name == "pro"


def test_a_tier_change_posted_with_the_token_of_its_page_goes_through(console):
    pro = Tier.objects.get(name="pro")
    page = console.get(f"/admin/policies/tier/{pro.pk}/change/").content.decode()
    form = {**tier_form(pro, name="platinum"), "csrfmiddlewaretoken": form_token(page)}
    response = console.post(f"/admin/policies/tier/{pro.pk}/change/", form)
    assert response.status_code == 302
    assert Tier.objects.get(pk=pro.pk).name == "platinum"


def test_the_dashboards_reset_without_the_csrf_token_is_a_403_and_resets_nothing(console):
    response = console.post("/admin/dashboard/reset/", {"level": "team", "key": "acme"})
    assert response.status_code == 403
    assert not LogEntry.objects.exists()


def test_the_dashboards_reset_with_the_token_of_its_page_goes_through(console):
    page = console.get("/admin/dashboard/reset/", {"level": "team", "key": "acme"}).content.decode()
    response = console.post(
        "/admin/dashboard/reset/", {"level": "team", "key": "acme", "csrfmiddlewaretoken": form_token(page)}
    )
    assert response.status_code == 302
    assert LogEntry.objects.count() == 1


RAISE = {"key": "acme", "level": "team", "rule": "token_bucket(1000, 100/s)", "factor": 2, "hours": 1, "version": 1}


def test_a_quick_raise_without_the_csrf_token_is_a_403_and_raises_nothing(console):
    response = console.post("/admin/dashboard/raise-limit/", RAISE)
    assert response.status_code == 403
    assert Tenant.objects.get(key="acme").overrides_until is None


def test_a_quick_raise_with_the_token_of_the_tenant_page_goes_through(console):
    page = console.get("/admin/dashboard/tenants/acme/").content.decode()
    response = console.post("/admin/dashboard/raise-limit/", {**RAISE, "csrfmiddlewaretoken": form_token(page)})
    assert response.status_code == 302
    assert Tenant.objects.get(key="acme").overrides_until is not None


def test_a_revoke_of_tokens_without_the_csrf_token_is_a_403(console):
    token = make_token("admin", "ops")
    response = console.post("/admin/policies/servicetoken/", {"action": "revoke", "_selected_action": ["1"]})
    assert response.status_code == 403
    assert APIClient(HTTP_AUTHORIZATION=f"Bearer {token}").get("/api/v1/tiers").status_code == 200


def test_the_login_form_without_the_csrf_token_is_a_403(operator_with_password):
    browser = Client(enforce_csrf_checks=True)
    response = browser.post("/admin/login/", {"username": "operator", "password": OPERATOR_PASSWORD})
    assert response.status_code == 403
    assert "_auth_user_id" not in browser.session


def test_the_login_form_with_its_token_logs_in(operator_with_password):
    browser = Client(enforce_csrf_checks=True)
    page = browser.get("/admin/login/").content.decode()
    response = browser.post(
        "/admin/login/?next=/admin/",
        {"username": "operator", "password": OPERATOR_PASSWORD, "csrfmiddlewaretoken": form_token(page)},
    )
    assert response.status_code == 302 and response["Location"] == "/admin/"
    assert browser.get("/admin/").status_code == 200
