"""Real nginx and Caddy, configured as docs/GATEWAYS.md says, in front of a small upstream,
asking the real service's forward-auth endpoint (gunicorn, as `make run` serves it) about
each request: a stock gateway enforces a team limit exactly."""

import copy
import json
import uuid

import pytest

from tests.gateways.running import Caddy, Nginx, Upstream
from tests.policies.conftest import POLICY
from tests.serving import Service

N = 5
GATEWAYS = {"nginx": Nginx, "caddy": Caddy}


def policy() -> dict:
    doc = copy.deepcopy(POLICY)
    # The free tier's team: N requests in an hour; its users' own limit (10/s) stays out of reach.
    doc["tiers"]["free"]["team"] = [{"type": "fixed_window", "limit": N, "window": 3600}]
    doc["tiers"]["slots"] = {"team": [{"type": "concurrency", "limit": 1, "lease": 60}]}
    doc["tenants"].update({f"slotted-{name}": {"tier": "slots"} for name in GATEWAYS})
    return doc


@pytest.fixture(scope="module")
def limiter():
    with Service(policy()) as service:
        yield service


@pytest.fixture(scope="module")
def upstream():
    with Upstream() as upstream:
        yield upstream


@pytest.fixture(scope="module", params=list(GATEWAYS))
def gateway(request, limiter, upstream):
    with GATEWAYS[request.param](limiter.port, upstream.port, limiter.token) as gateway:
        yield gateway


def team() -> str:
    """A team key of its own for each test: the free tier, a fresh window."""
    return f"team-{uuid.uuid4().hex[:12]}"


def user() -> str:
    """A user key of its own, with a full bucket (10, 1/s), for each test."""
    return f"user-{uuid.uuid4().hex[:12]}"


def test_a_team_limit_of_n_lets_exactly_n_of_3n_requests_through(gateway, upstream):
    key, path = team(), f"/{uuid.uuid4().hex}"
    answers = [gateway.get(path, {"X-Limiter-User": f"u{i}", "X-Limiter-Team": key}) for i in range(3 * N)]
    statuses = [status for status, _, _ in answers]
    assert statuses == [200] * N + [429] * (2 * N)
    assert upstream.hits.get(path, 0) == N
    for status, headers, _ in answers:
        assert headers["ratelimit-policy"].startswith('"user:token_bucket";q=10;w=10, "team:fixed_window";q=5;w=3600')
        assert headers["ratelimit"].startswith('"')
        if status == 429:
            assert 1 <= int(headers["retry-after"]) <= 3600
    assert [headers["ratelimit"].split(";r=")[1] for _, headers, _ in answers[:N]] == ["4", "3", "2", "1", "0"]


def test_a_denial_carries_the_retry_after_the_limiter_gave(gateway, limiter):
    key, who = team(), user()
    for _ in range(N):
        gateway.get("/", {"X-Limiter-User": who, "X-Limiter-Team": key})
    status, headers, body = gateway.get("/", {"X-Limiter-User": who, "X-Limiter-Team": key})
    asked = limiter.post("/api/v1/decisions", {"keys": {"user": who, "team": key, "global": "*"}, "dry_run": True})
    assert status == 429
    assert abs(int(headers["retry-after"]) - asked[1]["retry_after"]) <= 1
    assert f'"team:fixed_window";r=0;t={headers["retry-after"]}' == headers["ratelimit"]
    assert body  # a body the client can read


def test_the_upstream_gets_the_lease_of_a_concurrency_slot_which_releases(gateway, limiter, upstream):
    key, who = f"slotted-{gateway.name}", user()
    status, _, body = gateway.get("/slots", {"X-Limiter-User": who, "X-Limiter-Team": key})
    assert status == 200
    lease = json.loads(body)["x-limiter-lease"]
    assert lease
    assert gateway.get("/slots", {"X-Limiter-User": who, "X-Limiter-Team": key})[0] == 429
    assert limiter.post(f"/api/v1/leases/{lease}/release", {})[0] == 200
    assert gateway.get("/slots", {"X-Limiter-User": who, "X-Limiter-Team": key})[0] == 200


def test_without_a_slot_the_upstream_gets_an_empty_lease_not_the_clients(gateway):
    who = user()
    status, _, body = gateway.get("/", {"X-Limiter-User": who, "X-Limiter-Team": team(), "X-Limiter-Lease": "forged"})
    assert status == 200 and json.loads(body).get("x-limiter-lease", "") == ""


def test_a_request_without_its_key_header_never_reaches_the_upstream(gateway, upstream):
    path = f"/{uuid.uuid4().hex}"
    status, _, body = gateway.get(path, {"X-Limiter-User": user()})
    # nginx passes on only 401 and 403 from its auth request: anything else is its 500.
    expected = 500 if isinstance(gateway, Nginx) else 400
    assert status == expected and upstream.hits.get(path, 0) == 0
    if expected == 400:
        assert json.loads(body)["error"]["fields"] == {
            "X-Limiter-Team": "this header is required: it carries the team key"
        }
