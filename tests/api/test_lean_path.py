"""/decisions and /decisions/batch answer their common request on a lean path that skips DRF's
per-request machinery (policies.api.decisions.GatewayView). The same requests, made once on
the lean path and once with it turned off (DRF's own dispatch), give the same status, body
bytes and header fields in the same order, and leave the same metrics and denial statistics:
answers, denials, every kind of 4xx, the 503s and the 500."""

import json

import pytest
from django.db import DatabaseError
from django.test import Client
from prometheus_client import REGISTRY
from rest_framework.test import APIClient
from rest_framework.views import APIView

from policies.api import auth, decisions
from policies.api.decisions import GatewayView
from policies.api.observe import denial_stats
from policies.compile import PolicyUnavailable

from .conftest import make_token

URL = "/api/v1/decisions"
BATCH = "/api/v1/decisions/batch"
ACME = {"user": "u1", "team": "acme", "global": "*"}
TIGHT = {"user": "u9", "team": "nobody"}  # the free tier: the user's bucket holds 10

# (path, body: a dict sent as JSON or the raw bytes, extra WSGI environ), in order: the
# decisions before a denial use up what it is denied.
REQUESTS = [
    (URL, {"keys": ACME, "cost": 5}, {}),
    *[(URL, {"keys": TIGHT}, {})] * 11,  # the 11th is denied, with Retry-After
    (URL, {"keys": TIGHT, "cost": 2, "dry_run": True}, {}),
    (URL, {"keys": {"user": "u1"}, "cost": 11}, {}),  # can never fit: no Retry-After
    (URL, {"keys": {"team": "stranger"}, "priority": "batch"}, {}),
    (URL, {"keys": ACME}, {"HTTP_ACCEPT": "application/json"}),
    (URL, {"keys": ACME}, {"HTTP_ACCEPT": "*/*"}),
    (URL, {"keys": ACME, "cost": "5"}, {}),
    (URL, {"keys": {"planet": "earth"}}, {}),
    (URL, {"keys": {"user": "u"}, "kyes": {}}, {}),
    (URL, {"keys": {"user": "u"}, "priority": "vip"}, {}),
    (URL, {}, {}),
    (URL, b"", {"CONTENT_TYPE": "application/json"}),  # the test client leaves it out with no body
    (URL, b"[1, 2]", {}),
    (URL, b'{"keys": ', {}),
    (URL, b'{"keys": {"user": "u"}, "cost": NaN}', {}),
    (URL, b"\xff", {}),
    (URL, '{"keys": {"user": "\u00e9t\u00e9 \u2028"}}'.encode(), {}),
    (URL, {"keys": ACME}, {"HTTP_AUTHORIZATION": "Bearer la_000000000000_not-a-token"}),
    (URL, {"keys": ACME}, {"HTTP_AUTHORIZATION": "Bearer two words"}),
    (URL, {"keys": ACME}, {"HTTP_AUTHORIZATION": "bearer {admin}"}),
    (BATCH, {"requests": [{"keys": ACME}, {"keys": TIGHT, "cost": 2}, {"keys": {"user": "u1"}, "cost": 11}]}, {}),
    (BATCH, {"requests": [{"keys": ACME}, {"keys": ACME, "cost": -3}]}, {}),
    (BATCH, {"requests": [{"keys": ACME, "dry_run": True}]}, {}),
    (BATCH, {"requests": [{"keys": ACME}] * 1001}, {}),
    (BATCH, {"requests": []}, {}),
    (BATCH, {"keys": ACME}, {}),
]


@pytest.fixture
def tokens(db):
    return {"decide": make_token("decide"), "admin": make_token("admin", "ops-script")}


@pytest.fixture
def drf_only(monkeypatch):
    """Turns the lean path off: every request goes through DRF's own dispatch."""

    def turn_off():
        monkeypatch.setattr(GatewayView, "_takes_lean_path", lambda self, request, kwargs: False)

    return turn_off


@pytest.fixture
def drf_dispatches(monkeypatch):
    """How many requests DRF's own dispatch wrapped in its Request."""
    calls = []
    wrapped = APIView.initialize_request

    def counting(self, request, *args, **kwargs):
        calls.append(request.path)
        return wrapped(self, request, *args, **kwargs)

    monkeypatch.setattr(APIView, "initialize_request", counting)
    return calls


def send(client, path, body, extra, tokens):
    extra = {"HTTP_AUTHORIZATION": f"Bearer {tokens['decide']}", **extra}
    extra["HTTP_AUTHORIZATION"] = extra["HTTP_AUTHORIZATION"].format(**tokens)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.generic("POST", path, raw, content_type="application/json", **extra)


def wire(response) -> tuple:
    """All that reaches the client: status, header fields in order, body bytes."""
    return response.status_code, list(response.items()), response.content


def counters() -> dict:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in REGISTRY.collect()
        if metric.name in ("limiter_decisions", "limiter_store_unavailable")
        for sample in metric.samples
        if sample.name.endswith("_total")
    }


def run(requests, tokens, redis_store, client=None) -> tuple[list, dict, dict]:
    """Every request's wire answer, then what they added to the counters and the statistics;
    the store starts empty, so both runs decide from the same state."""
    redis_store.client.flushall()
    client = client or Client()
    before = counters()
    answers = [wire(send(client, *request, tokens)) for request in requests]
    after = counters()
    added = {name: value - before.get(name, 0) for name, value in after.items() if value != before.get(name, 0)}
    return answers, added, denial_stats().report(300)


def test_the_lean_path_and_drf_give_the_same_answers_headers_metrics_and_stats(
    api, tokens, redis_store, drf_only, drf_dispatches
):
    lean = run(REQUESTS, tokens, redis_store)
    assert drf_dispatches == []  # every one of them took the lean path
    drf_only()
    drf = run(REQUESTS, tokens, redis_store)
    assert len(drf_dispatches) == len(REQUESTS)
    for request, lean_answer, drf_answer in zip(REQUESTS, lean[0], drf[0]):
        assert lean_answer == drf_answer, request
    assert lean[1] == drf[1] and lean[2] == drf[2]
    statuses = {status for status, _, _ in lean[0]}
    assert statuses == {200, 400, 401}
    # What the comparison covered: a denial's Retry-After, and a 401's challenge.
    assert any(("Retry-After", "1") in headers for _, headers, _ in lean[0])
    assert any(name == "WWW-Authenticate" for _, headers, _ in lean[0] for name, _ in headers)


def answers_both_ways(requests, tokens, redis_store, drf_only, client=None):
    lean = run(requests, tokens, redis_store, client)[0]
    drf_only()
    return lean, run(requests, tokens, redis_store, client)[0]


def test_a_denied_permission_is_the_same_403(api, tokens, redis_store, drf_only, monkeypatch):
    monkeypatch.setattr(auth.CanDecide, "has_permission", lambda self, request, view: False)
    lean, drf = answers_both_ways([(URL, {"keys": ACME}, {})], tokens, redis_store, drf_only)
    assert lean == drf and lean[0][0] == 403


def test_an_unreachable_database_is_the_same_503(api, tokens, redis_store, drf_only, monkeypatch):
    def down(*args):
        raise DatabaseError("no such table")

    monkeypatch.setattr(auth, "find_token", down)
    lean, drf = answers_both_ways(
        [(URL, {"keys": ACME}, {}), (BATCH, {"requests": [{"keys": ACME}]}, {})], tokens, redis_store, drf_only
    )
    assert lean == drf and [status for status, _, _ in lean] == [503, 503]
    assert ("Retry-After", "1") in lean[0][1]


def test_a_worker_without_a_policy_is_the_same_503(api, tokens, redis_store, drf_only, monkeypatch):
    def no_policy():
        raise PolicyUnavailable("the database was down when this worker started")

    monkeypatch.setattr(decisions, "policy_cache", no_policy)
    lean, drf = answers_both_ways([(URL, {"keys": ACME}, {})], tokens, redis_store, drf_only)
    assert lean == drf and lean[0][0] == 503


def test_a_bug_is_the_same_500_in_the_error_shape(api, tokens, redis_store, drf_only, monkeypatch):
    def broken(decision):
        raise RuntimeError("a bug")

    monkeypatch.setattr(decisions, "decision_body", broken)
    client = Client(raise_request_exception=False)
    lean, drf = answers_both_ways(
        [(URL, {"keys": ACME}, {}), (BATCH, {"requests": [{"keys": ACME}]}, {})], tokens, redis_store, drf_only, client
    )
    assert lean == drf and [status for status, _, _ in lean] == [500, 500]
    assert json.loads(lean[0][2])["error"]["code"] == "server_error"


@pytest.mark.parametrize(
    "extra",
    [
        {"HTTP_ACCEPT": "application/json; indent=4"},
        {"HTTP_ACCEPT": "text/html"},
        {"QUERY_STRING": "format=json"},
        {"QUERY_STRING": "format=xml"},
        {"CONTENT_TYPE": "application/json; charset=utf-8"},
        {"CONTENT_TYPE": "text/plain"},
        {"HTTP_AUTHORIZATION": ""},
        {"HTTP_AUTHORIZATION": "Token abc"},
    ],
    ids=lambda extra: ", ".join(f"{k}={v!r}" for k, v in extra.items()),
)
def test_any_other_request_goes_through_drf(api, tokens, redis_store, drf_dispatches, extra):
    client = Client()
    response = send(client, URL, {"keys": ACME}, extra, tokens)
    assert drf_dispatches == [URL]
    assert response.status_code in (200, 401, 404, 406, 415)


def test_a_staff_session_goes_through_drf_and_needs_the_csrf_token(api, drf_dispatches, django_user_model):
    user = django_user_model.objects.create_user("operator", password="x", is_staff=True)
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.post(URL, {"keys": ACME}, format="json").status_code == 403
    client.get("/admin/")
    token = client.cookies["csrftoken"].value
    assert client.post(URL, {"keys": ACME}, format="json", HTTP_X_CSRFTOKEN=token).status_code == 200
    assert drf_dispatches.count(URL) == 2


def test_the_lean_path_leaves_the_caller_as_the_requests_user(api, tokens, redis_store):
    response = send(Client(), URL, {"keys": ACME}, {}, tokens)
    assert str(response.wsgi_request.user) == "token:gateway"
    response = send(Client(), URL, {"keys": ACME}, {"HTTP_AUTHORIZATION": "Bearer la_0_x"}, tokens)
    assert response.status_code == 401 and response.wsgi_request.user is None


def test_a_view_whose_drf_policies_differ_never_takes_the_lean_path(api, tokens):
    class Throttled(decisions.DecisionView):
        throttle_classes = [object]

    class Parsed(decisions.DecisionView):
        parser_classes = []

    assert decisions.DecisionView.as_view().view_initkwargs == {"lean": True}
    assert Throttled.as_view().view_initkwargs == {"lean": False}
    assert Parsed.as_view().view_initkwargs == {"lean": False}


def test_the_schema_still_documents_the_decision_views(db):
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    for path in (URL, BATCH):
        operation = schema["paths"][path]["post"]
        assert operation["tags"] == ["decisions"] and "200" in operation["responses"]
