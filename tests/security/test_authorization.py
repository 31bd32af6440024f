"""Who may call what: every endpoint, asked by every kind of caller, answers as the table in
docs/SECURITY.md says. The table is read from the document, and the endpoints from the URL
resolver and the OpenAPI schema, so that neither a new endpoint nor a change of the document
can slip by: an endpoint without a row fails, and so does a row without an endpoint."""

import json

import pytest
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib import admin
from django.contrib.auth.models import Group
from django.contrib.contenttypes.models import ContentType
from django.test import RequestFactory
from rest_framework.test import APIClient

from policies.models import Alert, CreditTopUp, Tier
from tests.conftest import free_port

from .conftest import make_token, revoked_token
from .matrix import CALLERS, MODEL_PREFIX, outcome, read_table, routes, schema_operations

ROWS = read_table()
# Every caller holds a CSRF cookie and sends it back, as a browser that loaded a page does:
# the table is about who may call what. CSRF is a fence of its own (test_csrf.py).
CSRF_SECRET = "MatrixCsrfSecret0123456789abcdef"
ACME = {"user": "u1", "team": "acme", "global": "*"}
BUCKET = {"type": "token_bucket", "capacity": 5, "per_second": 1}
# An alert whose receiver is a loopback port where nothing listens: a test send is refused at
# once (and answered, as the log keeps it, with a 200).
ALERT = {
    "name": "quota-80",
    "kind": "quota_used",
    "threshold": 0.8,
    "url": f"http://127.0.0.1:{free_port()}/",
    "format": "json",
}

# A URL to ask for each route with parameters (or a query it needs to be a valid request).
SAMPLE_URLS = {
    "/api/v1/leases/<str:lease>/release": "/api/v1/leases/no-such-lease/release",
    "/api/v1/authz/<rest:rest>": "/api/v1/authz/some/path",
    "/api/v1/reservations/<str:reservation_id>/commit": "/api/v1/reservations/no-such-reservation/commit",
    "/api/v1/reservations/<str:reservation_id>/cancel": "/api/v1/reservations/no-such-reservation/cancel",
    "/api/v1/buckets": "/api/v1/buckets?level=team&key=acme",
    "/api/v1/tiers/<str:name>": "/api/v1/tiers/pro",
    "/api/v1/tenants/<path:key>": "/api/v1/tenants/acme",
    "/api/v1/tenants/<path:key>/usage": "/api/v1/tenants/acme/usage",
    "/api/v1/tenants/<path:key>/quotas": "/api/v1/tenants/acme/quotas",
    "/api/v1/tenants/<path:key>/credits": "/api/v1/tenants/prepaid/credits",
    "/api/v1/levels/<str:name>": "/api/v1/levels/user",
    "/api/v1/priorities/<str:name>": "/api/v1/priorities/batch",
    "/api/v1/alerts/<str:name>": "/api/v1/alerts/quota-80",
    "/api/v1/alerts/<str:name>/deliveries": "/api/v1/alerts/quota-80/deliveries",
    "/api/v1/alerts/<str:name>/test": "/api/v1/alerts/quota-80/test",
    "/admin/dashboard/buckets/": "/admin/dashboard/buckets/?level=team&key=acme",
    "/admin/dashboard/dry-run/": "/admin/dashboard/dry-run/?level=team&key=acme&cost=1",
    "/admin/dashboard/reset/": "/admin/dashboard/reset/?level=team&key=acme",
    "/admin/dashboard/search/": "/admin/dashboard/search/?q=ac",
    "/admin/dashboard/tenants/<path:key>/": "/admin/dashboard/tenants/acme/",
    "/admin/autocomplete/": "/admin/autocomplete/?app_label=policies&model_name=tenant&field_name=tier&term=p",
    "/admin/r/<path:content_type_id>/<path:object_id>/": lambda: (
        f"/admin/r/{ContentType.objects.get_for_model(Tier).pk}/{Tier.objects.get(name='pro').pk}/"
    ),
    "/admin/<app_label>/": "/admin/policies/",
    "/admin/<url>": "/admin/no-such-page/",
}

# prepaid's balance of credits, so that a top-up is a valid request.
CREDITS = {"type": "quota", "limit": 1_000_000_000, "period": "none", "label": "CREDITS"}

# What each call sends: valid requests, so that `yes` means the call was really served.
BODIES = {
    ("POST", "/api/v1/tenants/<path:key>/credits"): {"level": "team", "rule": "CREDITS", "add": 5},
    ("POST", "/api/v1/decisions"): {"keys": ACME},
    ("POST", "/api/v1/decisions/batch"): {"requests": [{"keys": ACME}, {"keys": ACME, "cost": 2}]},
    ("POST", "/api/v1/reservations"): {"keys": ACME, "cost": 1},
    ("POST", "/api/v1/rls/json"): {
        "domain": "limiter",
        "descriptors": [{"entries": [{"key": "team", "value": "acme"}]}],
    },
    ("POST", "/api/v1/reservations/<str:reservation_id>/commit"): {"actual_cost": 1},
    ("POST", "/api/v1/reservations/<str:reservation_id>/cancel"): {},
    ("POST", "/api/v1/leases/<str:lease>/release"): {},
    **{
        (method, route): {}
        for method in ("POST", "PUT", "PATCH")
        for route in ("/api/v1/authz", "/api/v1/authz/<rest:rest>")
    },
    ("POST", "/api/v1/tiers"): {"name": "gold", "rules": {"user": [BUCKET]}},
    ("PUT", "/api/v1/tiers/<str:name>"): {"name": "pro", "rules": {"user": [BUCKET]}, "version": 1},
    ("PATCH", "/api/v1/tiers/<str:name>"): {"rules": {"team": [BUCKET]}, "version": 1},
    ("POST", "/api/v1/tenants"): {"key": "newco", "tier": "free"},
    ("PUT", "/api/v1/tenants/<path:key>"): {
        "key": "acme",
        "tier": "free",
        "overrides": {},
        "overrides_until": None,
        "version": 1,
    },
    ("PATCH", "/api/v1/tenants/<path:key>"): {"tier": "free", "version": 1},
    ("POST", "/api/v1/levels"): {"name": "region"},
    ("PUT", "/api/v1/levels/<str:name>"): {
        "name": "user",
        "position": 0,
        "fail_mode": "closed",
        "fallback_fraction": 0.25,
        "version": 1,
    },
    ("PATCH", "/api/v1/levels/<str:name>"): {"fail_mode": "closed", "version": 1},
    ("POST", "/api/v1/priorities"): {"name": "bulk", "watermark": 0.5},
    ("PUT", "/api/v1/priorities/<str:name>"): {"name": "batch", "watermark": 0.3, "levels": ["global"], "version": 1},
    ("PATCH", "/api/v1/priorities/<str:name>"): {"watermark": 0.3, "version": 1},
    ("POST", "/api/v1/whatif"): {"policy": {"tiers": {"pro": {"team": [BUCKET]}}}, "window": "1h"},
    ("PUT", "/api/v1/settings"): {"default_tier": "pro"},
    ("POST", "/api/v1/alerts"): {**ALERT, "name": "quota-90", "threshold": 0.9, "secret": "s"},
    ("PUT", "/api/v1/alerts/<str:name>"): {**ALERT, "threshold": 0.9, "window": None, "enabled": True, "version": 1},
    ("PATCH", "/api/v1/alerts/<str:name>"): {"threshold": 0.9, "version": 1},
    ("POST", "/api/v1/alerts/<str:name>/test"): {},
    ("PATCH", "/api/v1/settings"): {"default_tier": "pro"},
    # The admin's forms: a real reset; the others post nothing and show their form again.
    ("POST", "/admin/dashboard/reset/"): {"level": "team", "key": "acme"},
    ("POST", "/admin/dashboard/raise-limit/"): {
        "key": "acme",
        "level": "team",
        "rule": "token_bucket(1000, 100/s)",
        "factor": 2,
        "hours": 1,
        "version": 1,
    },
    ("POST", "/admin/dashboard/credits/"): {"key": "prepaid", "level": "team", "position": 0, "add": 5},
}
# Where the table says `yes`, the API serves these requests with a 2xx, but for samples that
# name a reservation that does not exist, or a row still in use.
SERVED_OTHERWISE = {
    ("POST", "/api/v1/leases/<str:lease>/release"): 404,
    ("POST", "/api/v1/reservations/<str:reservation_id>/commit"): 404,
    ("POST", "/api/v1/reservations/<str:reservation_id>/cancel"): 404,
    ("DELETE", "/api/v1/tiers/<str:name>"): 409,  # the default tier, with tenants
    ("DELETE", "/api/v1/levels/<str:name>"): 409,  # with rules
}


@pytest.fixture
def world(loaded, load, policy_doc, operator, member):
    """SPEC.md's policy (and prepaid, a tenant with a balance of credits), an operator, a
    member, and a row of every model the admin shows."""
    policy_doc["tenants"]["prepaid"] = {"tier": "pro", "overrides": {"team": [CREDITS]}}
    load(policy_doc)
    Group.objects.create(name="operators")
    make_token("decide", "edge-gateway")
    seen = {
        "user_agent": "test",
        "ip_address": "127.0.0.1",
        "username": "operator",
        "http_accept": "*/*",
        "path_info": "/admin/login/",
    }
    AccessAttempt.objects.create(**seen, get_data="", post_data="", failures_since_start=1)
    AccessLog.objects.create(**seen)
    AccessFailureLog.objects.create(**seen)
    Alert.objects.create(**ALERT, secret="s")
    CreditTopUp.objects.create(tenant_key="acme", level="team", rule="quota(5 credits)", amount=5, by="op")
    return {"operator": operator, "member": member}


def caller_client(caller: str, world) -> APIClient:
    client = APIClient(enforce_csrf_checks=True)
    client.cookies["csrftoken"] = CSRF_SECRET
    headers = {"HTTP_X_CSRFTOKEN": CSRF_SECRET}
    token = {
        "decide token": lambda: make_token("decide"),
        "admin token": lambda: make_token("admin", "ops"),
        "revoked token": revoked_token,
    }.get(caller)
    if token is not None:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {token()}"
    if caller == "staff session":
        client.force_login(world["operator"])
    elif caller == "non-staff session":
        client.force_login(world["member"])
    client.credentials(**headers)
    return client


# Forward-auth reads its request from headers.
AUTHZ_HEADERS = {"HTTP_X_LIMITER_USER": "u1", "HTTP_X_LIMITER_TEAM": "acme"}


def call(client: APIClient, method: str, url: str, route: str):
    body = BODIES.get((method, route))
    if route.startswith("/api/"):
        extra = AUTHZ_HEADERS if route.startswith("/api/v1/authz") else {}
        return client.generic(
            method, url, data="" if body is None else json.dumps(body), content_type="application/json", **extra
        )
    if method == "GET":
        return client.get(url)
    return client.post(url, body or {})


# --- the sample URLs of a row ----------------------------------------------------------------


def sample_urls(route: str, models) -> list[tuple[str, type | None]]:
    """The URLs to ask for a route: one, or for the admin's model pages one per model."""
    if not route.startswith(MODEL_PREFIX):
        sample = SAMPLE_URLS.get(route, route)
        sample = sample() if callable(sample) else sample
        assert "<" not in sample, f"add a sample URL for {route} to SAMPLE_URLS"
        return [(sample, None)]
    return [(model_page(route, model), model) for model in models]


def sample_object(model):
    return model._default_manager.order_by("pk").first()


def model_page(route: str, model) -> str:
    obj = sample_object(model)
    url = route.replace("<app>", model._meta.app_label).replace("<model>", model._meta.model_name)
    url = url.replace("<path:object_id>", str(obj.pk)).replace("<id>", str(obj.pk))
    if "<…>/history/<…>" in url:
        url = url.replace("<…>/history/<…>", f"{obj.pk}/history/{obj.history.first().history_id}")
    assert "<" not in url, f"model_page() cannot fill in {route}"
    return url


def model_admin_allows(operator, model, route: str, method: str) -> bool:
    """Whether the model's admin offers this page (or this form's POST) to the operator at
    all: a model whose admin never offers an action refuses it with 403 to everyone."""
    model_admin = admin.site._registry[model]
    request = RequestFactory().generic(method, "/")
    request.user = operator
    obj = sample_object(model)
    page = route[len(MODEL_PREFIX) :]
    if page == "add/":
        return model_admin.has_add_permission(request)
    if page.endswith("delete/"):
        return model_admin.has_delete_permission(request, obj)
    if method == "POST" and page != "":
        return model_admin.has_change_permission(request, obj)
    return model_admin.has_view_or_change_permission(request, obj)


def expected_for(row, caller: str, route: str, method: str, model, world) -> str:
    wanted = row.expected[caller]
    if wanted == "yes" and model is not None and not model_admin_allows(world["operator"], model, route, method):
        return "403"
    return wanted


# --- the matrix --------------------------------------------------------------------------------


CELLS = [
    pytest.param(row, method, caller, id=f"{method} {row.path} as {caller}")
    for row in ROWS
    for method in row.methods
    for caller in CALLERS
]


@pytest.mark.parametrize("row, method, caller", CELLS)
def test_every_caller_gets_what_the_table_says(world, row, method, caller):
    models = routes().get(row.path)
    assert models is not None, f"the table names {row.path}, which no URL pattern serves"
    client = caller_client(caller, world)
    answers, expected = {}, {}
    for url, model in sample_urls(row.path, models):
        response = call(client, method, url, row.path)
        answers[url] = outcome(response)
        expected[url] = expected_for(row, caller, row.path, method, model, world)
        if answers[url] == "401":
            assert response["WWW-Authenticate"] == 'Bearer realm="limiter"'
        if answers[url] == "yes" and row.path.startswith("/api/v1/"):
            served = SERVED_OTHERWISE.get((method, row.path))
            status = response.status_code
            assert status == served if served else 200 <= status < 300, (url, status, response.content[:300])
    assert answers == expected


def test_every_route_has_a_row_and_every_row_a_route():
    served, documented = set(routes()), {row.path for row in ROWS}
    assert served - documented == set(), "routes with no row in docs/SECURITY.md's table"
    assert documented - served == set(), "rows of docs/SECURITY.md's table that no route serves"


def test_each_route_has_one_row():
    paths = [row.path for row in ROWS]
    assert sorted({path for path in paths if paths.count(path) > 1}) == []


# API routes the OpenAPI schema leaves out on purpose, each served by a gateway view with no
# describing view: envoyproxy/ratelimit's JSON contract, whose one-decision rules (a level in
# each descriptor, one key per level, one cost) no JSON schema can state (docs/GATEWAYS.md).
NOT_IN_SCHEMA = {"/api/v1/rls/json": {"POST"}}


def test_the_api_rows_name_exactly_the_methods_of_the_schema():
    documented = {row.path: set(row.methods) for row in ROWS if row.path.startswith("/api/v1/")}
    assert documented == schema_operations() | NOT_IN_SCHEMA
    assert not set(NOT_IN_SCHEMA) & set(schema_operations())


def test_every_api_row_that_lets_anyone_in_has_a_valid_request_to_send():
    for row in ROWS:
        if row.path.startswith("/api/v1/"):
            for method in row.methods:
                if method in ("POST", "PUT", "PATCH"):
                    assert (method, row.path) in BODIES, f"add a body for {method} {row.path} to BODIES"
