"""The gateways' request path (policies.api.gateway): /decisions and /decisions/batch are
plain Django views on it. Every answer keeps the API's shapes: decisions with their header
fields, each kind of 4xx in the one error shape, the 503s, and a bug's 500; the schema still
describes them."""

import json

import pytest
from django.db import DatabaseError
from django.test import Client
from rest_framework.test import APIClient

from policies.api import auth, decisions
from policies.api.gateway import GatewayView, gateway_endpoints
from policies.compile import PolicyUnavailable

from .conftest import make_token

URL = "/api/v1/decisions"
BATCH = "/api/v1/decisions/batch"
ACME = {"user": "u1", "team": "acme", "global": "*"}
TIGHT = {"user": "u9", "team": "nobody"}  # the free tier: the user's bucket holds 10


@pytest.fixture
def tokens(db):
    return {"decide": make_token("decide"), "admin": make_token("admin", "ops-script")}


def send(path, body, tokens, client=None, **extra):
    extra = {"HTTP_AUTHORIZATION": f"Bearer {tokens['decide']}", **extra}
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return (client or Client()).generic("POST", path, raw, content_type="application/json", **extra)


def error(response) -> dict:
    assert response["Content-Type"] == "application/json"
    found = json.loads(response.content)
    assert set(found) == {"error"} and set(found["error"]) == {"code", "message", "fields"}
    return found["error"]


def test_an_allowed_decision_is_a_200_with_its_header_fields_and_allow(api, tokens):
    response = send(URL, {"keys": ACME, "cost": 5}, tokens)
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    assert json.loads(response.content)["allowed"] is True
    assert response["RateLimit"] == '"user:token_bucket";r=45' and "RateLimit-Policy" in response
    assert response["Allow"] == "POST, OPTIONS"
    # JSON as DRF's renderer writes it: compact, UTF-8.
    assert response.content.startswith(b'{"allowed":true,"retry_after":0.0,')


def test_a_denial_is_a_200_with_retry_after(api, tokens):
    for _ in range(10):
        send(URL, {"keys": TIGHT}, tokens)
    response = send(URL, {"keys": TIGHT}, tokens)
    assert response.status_code == 200 and json.loads(response.content)["allowed"] is False
    assert response["Retry-After"] == "1"


def test_a_batch_is_answered_in_order(api, tokens):
    response = send(BATCH, {"requests": [{"keys": ACME}, {"keys": {"user": "u1"}, "cost": 11}]}, tokens)
    assert response.status_code == 200
    assert [d["allowed"] for d in json.loads(response.content)["decisions"]] == [True, False]


@pytest.mark.parametrize(
    "path, body, field",
    [
        (URL, {"keys": ACME, "cost": "5"}, "cost"),
        (URL, {"keys": {"planet": "earth"}}, "keys.planet"),
        (URL, {"keys": {"user": "u"}, "kyes": {}}, "kyes"),
        (URL, {}, "keys"),
        (URL, b"[1, 2]", "body"),
        (BATCH, {"requests": [{"keys": ACME}, {"keys": ACME, "cost": -3}]}, "requests.1.cost"),
        (BATCH, {"requests": []}, "requests"),
    ],
)
def test_a_bad_field_is_a_400_naming_it(api, tokens, path, body, field):
    response = send(path, body, tokens)
    assert response.status_code == 400
    found = error(response)
    assert found["code"] == "invalid" and field in found["fields"] and found["message"].startswith(field)


@pytest.mark.parametrize("raw", [b'{"keys": ', b'{"keys": {"user": "u"}, "cost": NaN}', b"\xff"])
def test_a_body_that_is_not_json_is_a_400(api, tokens, raw):
    response = send(URL, raw, tokens)
    assert response.status_code == 400 and error(response)["code"] == "malformed_request"


def test_an_empty_body_is_an_empty_object(api, tokens):
    response = send(URL, b"", tokens, CONTENT_TYPE="application/json")
    assert response.status_code == 400 and error(response)["fields"] == {"keys": "this field is required"}


@pytest.mark.parametrize(
    "authorization, code",
    [
        ("", "not_authenticated"),
        ("Token abc", "not_authenticated"),
        ("Bearer la_000000000000_not-a-token", "authentication_failed"),
        ("Bearer two words", "authentication_failed"),
    ],
)
def test_no_or_a_bad_token_is_a_401_with_the_bearer_challenge(api, tokens, authorization, code):
    response = send(URL, {"keys": ACME}, tokens, HTTP_AUTHORIZATION=authorization)
    assert response.status_code == 401 and error(response)["code"] == code
    assert response["WWW-Authenticate"] == 'Bearer realm="limiter"'


def test_a_caller_without_the_scope_is_a_403(api, tokens, monkeypatch):
    monkeypatch.setattr(auth, "DECIDING_SCOPES", ())
    monkeypatch.setattr("policies.api.gateway.DECIDING_SCOPES", ())
    response = send(URL, {"keys": ACME}, tokens)
    assert response.status_code == 403 and error(response)["code"] == "permission_denied"


def test_the_admin_scope_may_decide(api, tokens):
    response = send(URL, {"keys": ACME}, tokens, HTTP_AUTHORIZATION=f"Bearer {tokens['admin']}")
    assert response.status_code == 200


@pytest.mark.parametrize(
    "extra, status, code",
    [
        ({"HTTP_ACCEPT": "text/html"}, 406, "not_acceptable"),
        ({"CONTENT_TYPE": "text/plain"}, 415, "unsupported_media_type"),
    ],
)
def test_an_answer_it_cannot_give_or_a_body_it_cannot_read_is_a_4xx(api, tokens, extra, status, code):
    response = send(URL, {"keys": ACME}, tokens, **extra)
    assert response.status_code == status and error(response)["code"] == code


@pytest.mark.parametrize(
    "extra",
    [
        {"HTTP_ACCEPT": "application/json"},
        {"HTTP_ACCEPT": "*/*"},
        {"HTTP_ACCEPT": "text/html, application/*;q=0.8"},
        {"CONTENT_TYPE": "application/json; charset=utf-8"},
    ],
)
def test_json_with_parameters_or_among_others_is_fine(api, tokens, extra):
    assert send(URL, {"keys": ACME}, tokens, **extra).status_code == 200


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_another_method_is_a_405_naming_the_allowed_ones(api, tokens, method):
    response = Client().generic(method, URL, HTTP_AUTHORIZATION=f"Bearer {tokens['decide']}")
    assert response.status_code == 405 and error(response)["code"] == "method_not_allowed"
    assert response["Allow"] == "POST, OPTIONS"


def test_options_answers_the_allowed_methods_without_credentials(api):
    response = Client().options(URL)
    assert response.status_code == 200 and response["Allow"] == "POST, OPTIONS" and response.content == b""


def test_an_unreachable_database_is_a_503_with_retry_after(api, tokens, monkeypatch):
    def down(*args):
        raise DatabaseError("no such table")

    monkeypatch.setattr("policies.services.auth.find_token", down)
    for path, body in ((URL, {"keys": ACME}), (BATCH, {"requests": [{"keys": ACME}]})):
        response = send(path, body, tokens)
        assert response.status_code == 503 and response["Retry-After"] == "1"
        assert error(response)["code"] == "database_unavailable"


def test_a_worker_without_a_policy_is_a_503(api, tokens, monkeypatch):
    def no_policy():
        raise PolicyUnavailable("the database was down when this worker started")

    monkeypatch.setattr("policies.services.decisions.policy_cache", no_policy)
    response = send(URL, {"keys": ACME}, tokens)
    assert response.status_code == 503 and error(response)["code"] == "database_unavailable"


def test_a_bug_is_a_500_in_the_error_shape(api, tokens, monkeypatch):
    def broken(decision):
        raise RuntimeError("a bug")

    monkeypatch.setattr(decisions, "decision_body", broken)
    client = Client(raise_request_exception=False)
    for path, body in ((URL, {"keys": ACME}), (BATCH, {"requests": [{"keys": ACME}]})):
        response = send(path, body, tokens, client)
        assert response.status_code == 500 and error(response)["code"] == "server_error"


def test_a_staff_session_may_decide_with_its_csrf_token(api, django_user_model):
    user = django_user_model.objects.create_user("operator", password="x", is_staff=True)
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    response = client.post(URL, {"keys": ACME}, format="json")
    assert response.status_code == 403 and error(response)["message"].startswith("CSRF Failed")
    client.get("/admin/")
    token = client.cookies["csrftoken"].value
    assert client.post(URL, {"keys": ACME}, format="json", HTTP_X_CSRFTOKEN=token).status_code == 200


def test_a_session_that_is_not_staff_is_a_403(api, django_user_model):
    client = Client()
    client.force_login(django_user_model.objects.create_user("someone", password="x"))
    response = client.post(URL, {"keys": ACME}, content_type="application/json")
    assert response.status_code == 403 and error(response)["code"] == "permission_denied"


def test_the_token_becomes_the_requests_user(api, tokens):
    response = send(URL, {"keys": ACME}, tokens)
    assert str(response.wsgi_request.user) == "token:gateway"


def test_the_path_is_timed_per_endpoint(api, tokens):
    from prometheus_client import REGISTRY

    def count(endpoint):
        return REGISTRY.get_sample_value("limiter_decision_seconds_count", {"endpoint": endpoint}) or 0

    before = count("batch")
    send(BATCH, {"requests": [{"keys": ACME}]}, tokens)
    assert count("batch") == before + 1


def test_the_schema_documents_the_gateway_views_through_their_describing_views(db):
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    for path in (URL, BATCH):
        operation = schema["paths"][path]["post"]
        assert operation["tags"] == ["decisions"] and "200" in operation["responses"]
        assert {"bearerAuth": []} in operation["security"]
        assert set(schema["paths"][path]) == {"post"}


def test_the_hook_adds_each_described_gateway_view_once_per_method():
    added = gateway_endpoints([])
    paths = sorted(path for path, _, method, _ in added if method == "POST")
    assert "/api/v1/decisions" in paths and "/api/v1/decisions/batch" in paths
    assert len(paths) == len(set(paths))
    assert all(issubclass(callback.cls, GatewayView) is False for _, _, _, callback in added)


def test_forward_auth_has_a_group_of_its_own_in_the_schema_and_the_decisions_group_opens_the_docs(db):
    """Issue 25: /api/docs/ opened the decisions group with ten /authz rows (five methods, two
    paths, sorted before /decisions). Same paths; a tag of their own; the groups in order."""
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    by_tag: dict[str, list[str]] = {}
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            for tag in operation["tags"]:
                by_tag.setdefault(tag, []).append(f"{method.upper()} {path}")
    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    assert sorted(by_tag["forward-auth"]) == sorted(
        f"{method} {path}" for path in ("/api/v1/authz", "/api/v1/authz/{rest}") for method in methods
    )
    assert by_tag["decisions"] == [
        "POST /api/v1/decisions",
        "POST /api/v1/decisions/batch",
        "POST /api/v1/leases/{lease}/release",
    ]
    declared = [tag["name"] for tag in schema["tags"]]
    assert declared[:3] == ["decisions", "reservations", "forward-auth"]
    assert set(by_tag) <= set(declared)  # every group has its place; none left to the viewer's order
