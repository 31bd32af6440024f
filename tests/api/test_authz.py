"""Forward-auth, /api/v1/authz: one decision from the request's headers, answered by status."""

import json

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client, override_settings

from policies.services.forward_auth import authz_keys_problems
from policies.services.leases import read_ticket

from .conftest import make_token

AUTHZ = "/api/v1/authz"
# The free tier: the user's bucket holds 10 (1/s), the team's 100.
HEADERS = {"HTTP_X_LIMITER_USER": "u9", "HTTP_X_LIMITER_TEAM": "nobody"}


@pytest.fixture
def token(db):
    return make_token("decide")


def ask(token, path=AUTHZ, method="GET", **headers):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}", **headers}
    return Client().generic(method, path, **headers)


def error(response) -> dict:
    return json.loads(response.content)["error"]


def test_an_allowed_request_is_a_200_with_the_ratelimit_fields_and_an_empty_lease(api, token):
    response = ask(token, **HEADERS)
    assert response.status_code == 200 and response.content == b""
    assert response["RateLimit"] == '"user:token_bucket";r=9'
    assert response["RateLimit-Policy"].startswith(
        '"user:token_bucket";q=10;w=10, "team:token_bucket";q=100;w=10, "global:'
    )
    assert response["X-Limiter-Lease"] == ""  # no concurrency rule, no slot
    assert "Retry-After" not in response


def test_a_denied_request_is_a_429_with_retry_after_and_the_ratelimit_fields(api, token):
    for _ in range(10):
        assert ask(token, **HEADERS).status_code == 200
    response = ask(token, **HEADERS)
    assert response.status_code == 429
    assert response["Retry-After"] == "1" and response["RateLimit"] == '"user:token_bucket";r=0;t=1'
    body = json.loads(response.content)
    assert body["allowed"] is False and body["blocked_by"] == "user: token_bucket(10, 1/s)"


def test_deny_status_403_carries_the_wait_in_its_own_header(api, token):
    for _ in range(10):
        ask(token, **HEADERS)
    response = ask(token, f"{AUTHZ}?deny_status=403", **HEADERS)
    assert response.status_code == 403
    assert response["X-Limiter-Retry-After"] == "1" and "Retry-After" not in response
    assert response["RateLimit"] == '"user:token_bucket";r=0;t=1'


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
def test_any_method_and_any_path_below_is_decided(api, token, method):
    response = ask(token, f"{AUTHZ}/v1/chat/completions", method, **HEADERS)
    assert response.status_code == 200 and response["RateLimit"] == '"user:token_bucket";r=9'


@pytest.mark.parametrize("below", ["/a%0Ab", "/%0A", "/v1/x%0D%0Ay"])
def test_a_path_below_with_a_newline_is_decided_too(api, token, below):
    # Found by schemathesis on PostgreSQL's pass: Django's <path:> stops at a newline (a 404).
    response = ask(token, f"{AUTHZ}{below}", **HEADERS)
    assert response.status_code == 200 and response["RateLimit"] == '"user:token_bucket";r=9'


def test_it_decides_for_the_levels_it_has_headers_for_and_the_global_key(api, token, engine):
    ask(token, HTTP_X_LIMITER_USER="u1", HTTP_X_LIMITER_TEAM="acme")
    rows = engine.limiter_for("acme").inspect("global", "*")
    assert rows[0]["state"]["tokens"] == pytest.approx(99999)


def test_the_cost_and_the_priority_come_from_their_headers(api, token):
    response = ask(token, HTTP_X_LIMITER_COST="4", HTTP_X_LIMITER_PRIORITY="interactive", **HEADERS)
    assert response.status_code == 200 and response["RateLimit"] == '"user:token_bucket";r=6'
    assert ask(token, HTTP_X_LIMITER_COST="2.5", **HEADERS)["RateLimit"] == '"user:token_bucket";r=3'


@pytest.mark.parametrize("header", ["HTTP_X_LIMITER_USER", "HTTP_X_LIMITER_TEAM"])
def test_a_missing_key_header_is_a_400_naming_it(api, token, header):
    headers = {**HEADERS}
    del headers[header]
    response = ask(token, **headers)
    name = "X-Limiter-User" if header.endswith("USER") else "X-Limiter-Team"
    assert response.status_code == 400
    assert error(response)["code"] == "invalid" and list(error(response)["fields"]) == [name]


@pytest.mark.parametrize("cost", ["abc", "-1", "0", "nan", "inf", "1e400", "1e16", "0x10", ""])
def test_a_bad_cost_is_a_400_naming_the_header(api, token, cost):
    response = ask(token, HTTP_X_LIMITER_COST=cost, **HEADERS)
    assert response.status_code == 400 and list(error(response)["fields"]) == ["X-Limiter-Cost"]


@pytest.mark.parametrize("cost", ["1e-9", "0.5", "0.999"])
def test_a_cost_below_the_floor_is_a_400_naming_the_header(api, token, cost):
    response = ask(token, HTTP_X_LIMITER_COST=cost, **HEADERS)
    assert response.status_code == 400
    assert error(response)["fields"] == {"X-Limiter-Cost": f"must be at least 1 (LIMITER_AUTHZ_MIN_COST), got '{cost}'"}
    # Nothing was taken: the user's bucket is whole.
    assert ask(token, **HEADERS)["RateLimit"] == '"user:token_bucket";r=9'


@override_settings(LIMITER_AUTHZ_MIN_COST=0)
def test_with_no_floor_any_cost_above_0_is_taken(api, token):
    answers = [ask(token, HTTP_X_LIMITER_COST="0.5", **HEADERS) for _ in range(2)]
    # 9.5 left, then 9: the header gives whole requests.
    assert [(a.status_code, a["RateLimit"]) for a in answers] == [(200, '"user:token_bucket";r=9')] * 2
    assert ask(token, HTTP_X_LIMITER_COST="0", **HEADERS).status_code == 400


@override_settings(LIMITER_AUTHZ_MIN_COST=3)
def test_a_floor_above_the_default_cost_makes_the_cost_header_required(api, token):
    response = ask(token, **HEADERS)
    assert response.status_code == 400
    assert error(response)["fields"] == {
        "X-Limiter-Cost": "this header is required: the default cost, 1, is below LIMITER_AUTHZ_MIN_COST (3)"
    }
    assert ask(token, HTTP_X_LIMITER_COST="2", **HEADERS).status_code == 400
    response = ask(token, HTTP_X_LIMITER_COST="3", **HEADERS)
    assert response.status_code == 200 and response["RateLimit"] == '"user:token_bucket";r=7'


def test_the_schema_gives_the_floor_as_the_costs_minimum(api, token):
    schema = Client().get("/api/schema/?format=json", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    parameters = schema["paths"]["/api/v1/authz"]["get"]["parameters"]
    (cost,) = [parameter for parameter in parameters if parameter["name"] == "X-Limiter-Cost"]
    assert cost["schema"] == {"type": "number", "minimum": 1, "maximum": 1e15}
    assert not cost.get("required")


@pytest.mark.parametrize("priority", ["vip", ""])
def test_an_unknown_priority_is_a_400_naming_the_header(api, token, priority):
    response = ask(token, HTTP_X_LIMITER_PRIORITY=priority, **HEADERS)
    assert response.status_code == 400 and list(error(response)["fields"]) == ["X-Limiter-Priority"]


def test_a_key_too_long_is_a_400_naming_the_header(api, token):
    response = ask(token, HTTP_X_LIMITER_USER="u" * 257, HTTP_X_LIMITER_TEAM="acme")
    assert response.status_code == 400 and list(error(response)["fields"]) == ["X-Limiter-User"]


@pytest.mark.parametrize(
    "query, field", [("deny_status=404", "deny_status"), ("deny_status=", "deny_status"), ("status=403", "status")]
)
def test_a_bad_query_is_a_400_naming_the_parameter(api, token, query, field):
    response = ask(token, f"{AUTHZ}?{query}", **HEADERS)
    assert response.status_code == 400 and list(error(response)["fields"]) == [field]


def test_it_needs_a_token(api):
    response = Client().get(AUTHZ, **HEADERS)
    assert response.status_code == 401 and response["WWW-Authenticate"] == 'Bearer realm="limiter"'


def test_a_browsers_accept_and_body_do_not_matter(api, token):
    response = Client().generic(
        "POST",
        AUTHZ,
        b"<form>",
        content_type="text/html",
        HTTP_ACCEPT="text/html",
        HTTP_AUTHORIZATION=f"Bearer {token}",
        **HEADERS,
    )
    assert response.status_code == 200


@override_settings(LIMITER_AUTHZ_KEYS={"user": "X-Caller", "team": "X-Org"})
def test_the_headers_are_configurable(api, token):
    assert ask(token, HTTP_X_CALLER="u9", HTTP_X_ORG="nobody").status_code == 200
    response = ask(token, **HEADERS)
    assert response.status_code == 400 and list(error(response)["fields"]) == ["X-Caller"]


@override_settings(LIMITER_AUTHZ_KEYS={"user": "X-Limiter-User", "region": "X-Region"})
def test_a_header_mapped_to_a_level_not_configured_is_a_400_naming_it(api, token):
    response = ask(token, HTTP_X_REGION="eu", **HEADERS)
    assert response.status_code == 400 and list(error(response)["fields"]) == ["X-Region"]


@pytest.mark.parametrize(
    "mapping",
    [[], {}, "X-User", {"user": ""}, {"user": "X User"}, {"user": 3}, {"global": "X-Global"}],
)
def test_a_bad_key_map_is_a_problem_the_system_check_reports(db, mapping):
    assert authz_keys_problems(mapping)
    with override_settings(LIMITER_AUTHZ_KEYS=mapping), pytest.raises(SystemCheckError, match="policies.E005"):
        call_command("check")


def test_the_default_key_map_has_no_problem():
    assert authz_keys_problems({"user": "X-Limiter-User", "team": "X-Limiter-Team"}) == []


SLOTS = {
    "default_tier": "t",
    "levels": [{"name": "user"}, {"name": "team"}],
    "tiers": {
        "t": {
            "user": [{"type": "fixed_window", "limit": 3, "window": 60}],
            "team": [{"type": "concurrency", "limit": 1, "lease": 30}],
        }
    },
}
LAB = {"HTTP_X_LIMITER_USER": "u1", "HTTP_X_LIMITER_TEAM": "lab"}


def test_a_request_that_asks_for_a_slot_answers_its_lease_which_releases(engine, load, token):
    load(SLOTS)
    lease = ask(token, **LAB, HTTP_X_LIMITER_SLOT="1")["X-Limiter-Lease"]
    assert read_ticket(lease) == ({"user": "u1", "team": "lab"}, lease.split(".")[0])
    denied = ask(token, **LAB, HTTP_X_LIMITER_SLOT="1")
    assert denied.status_code == 429 and "X-Limiter-Lease" not in denied
    assert json.loads(denied.content)["blocked_by"].startswith("team: concurrency(1")
    released = Client().post(
        f"/api/v1/leases/{lease}/release", HTTP_AUTHORIZATION=f"Bearer {token}", content_type="application/json"
    )
    assert released.status_code == 200
    assert ask(token, **LAB, HTTP_X_LIMITER_SLOT="1").status_code == 200


def test_by_default_a_request_takes_no_slot_and_meets_no_concurrency_rule(engine, load, token):
    """nginx and Caddy cannot give a slot back: without X-Limiter-Slot, none is taken, and a
    slot held by another caller stops nobody; every other rule counts as usual."""
    load(SLOTS)
    held = ask(token, **LAB, HTTP_X_LIMITER_SLOT="1")["X-Limiter-Lease"]
    assert held
    answers = [ask(token, **LAB) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert [a["X-Limiter-Lease"] for a in answers[:2]] == ["", ""]
    assert json.loads(answers[2].content)["blocked_by"].startswith("user: fixed_window(3")


def test_limiter_authz_slots_takes_one_unless_the_header_says_0(engine, load, token):
    load(SLOTS)
    with override_settings(LIMITER_AUTHZ_SLOTS=True):
        without = ask(token, **LAB, HTTP_X_LIMITER_SLOT="0")
        taken = ask(token, **LAB)
        refused = ask(token, **{**LAB, "HTTP_X_LIMITER_USER": "u2"})
    assert without.status_code == 200 and without["X-Limiter-Lease"] == ""
    assert taken.status_code == 200 and taken["X-Limiter-Lease"]
    assert refused.status_code == 429


@pytest.mark.parametrize("value", ["yes", "2", "", "true"])
def test_a_slot_header_that_is_not_1_or_0_is_a_400_naming_it(api, token, value):
    response = ask(token, **HEADERS, HTTP_X_LIMITER_SLOT=value)
    assert response.status_code == 400
    assert "must be 1 (take a concurrency slot) or 0" in error(response)["fields"]["X-Limiter-Slot"]


def test_the_decision_is_counted_and_timed(api, token):
    from prometheus_client import REGISTRY

    def sample(name, labels):
        return REGISTRY.get_sample_value(name, labels) or 0

    allowed = sample("limiter_decisions_total", {"result": "allowed", "level": "", "reason": "OK"})
    timed = sample("limiter_decision_seconds_count", {"endpoint": "authz"})
    ask(token, **HEADERS)
    assert sample("limiter_decisions_total", {"result": "allowed", "level": "", "reason": "OK"}) == allowed + 1
    assert sample("limiter_decision_seconds_count", {"endpoint": "authz"}) == timed + 1


def test_trace_is_a_405(api, token):
    response = ask(token, method="TRACE", **HEADERS)
    assert response.status_code == 405 and "TRACE" not in response["Allow"]
