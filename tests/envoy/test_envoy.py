"""A real Envoy, configured as docs/GATEWAYS.md says, in front of a small upstream, its HTTP
ratelimit filter asking the real service's gRPC endpoint (gunicorn with RLS_BIND, as
`make run` serves it; service tokens required) for the team the client's API key names,
whatever x-limiter-* header fields the client sends."""

import copy
import json
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from tests.envoy.gateway import Caller, Envoy, Upstream
from tests.gateways.running import team_remaining
from tests.policies.conftest import POLICY
from tests.serving import Service, free_port

N = 5

# What a client may add to its request in the hope of paying less, or of making another team
# (`victim`) pay; sent on top of its own x-limiter-team, as the recipe before issue 26 read it.
# A cost that is no number made Envoy drop the descriptors (no call, no limit); a cost of 0
# made them check-only; an unknown priority failed the call, and failure_mode_deny false let
# the request through.
FORGERIES = {
    "team": lambda victim: {"x-limiter-team": victim.team},
    "cost that is no number": lambda victim: {"x-limiter-cost": "abc"},
    "cost of 0": lambda victim: {"x-limiter-cost": "0"},
    "priority": lambda victim: {"x-limiter-priority": "vip"},
    "user": lambda victim: {"x-limiter-user": "u" * 300},  # too long a key: a failed call
}


def caller(team: str) -> Caller:
    return Caller(f"key-{uuid.uuid4().hex}", team, "")


def fresh(label: str) -> Caller:
    """A caller of its own, its team a fresh one of the free tier (N an hour)."""
    return caller(f"t-{label.replace(' ', '-')}-{uuid.uuid4().hex[:8]}")


# The API keys Envoy knows, by label.
CALLERS = {
    **{f"{forgery} {role}": fresh(forgery) for forgery in FORGERIES for role in ("caller", "victim")},
    **{label: fresh(label) for label in ("exact", "shared", "token", "down")},
    "slotted": caller("slotted"),
    "pair": caller("pair"),
    "gone": caller("gone"),
}


def policy() -> dict:
    doc = copy.deepcopy(POLICY)
    doc["tiers"]["free"]["team"] = [{"type": "fixed_window", "limit": N, "window": 3600}]
    doc["tiers"]["slots"] = {"team": [{"type": "concurrency", "limit": 1, "lease": 60}]}
    doc["tenants"]["slotted"] = {"tier": "slots"}
    doc["tiers"]["pairs"] = {"team": [{"type": "concurrency", "limit": 2, "lease": 60}]}
    doc["tenants"]["pair"] = doc["tenants"]["gone"] = {"tier": "pairs"}
    return doc


def start_limiter() -> tuple[Service, int]:
    """The service as `make run` serves it, with one gRPC call made: the worker's first call
    reads the policy and the token from the database, which on a busy machine may take longer
    than the 0.5 s Envoy waits (it would then let the request through, unlimited)."""
    rls = free_port()
    service = Service(policy(), extra_env={"RLS_BIND": f"127.0.0.1:{rls}", "LIMITER_RLS_REQUIRE_TOKEN": "1"})
    service.start()
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="team", value="warm-up")
    warm_up = rls_pb2.RateLimitRequest(
        domain="limiter", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
    )
    with grpc.insecure_channel(f"127.0.0.1:{rls}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        stub.ShouldRateLimit(warm_up, metadata=(("authorization", f"Bearer {service.token}"),), timeout=30)
    return service, rls


@pytest.fixture(scope="module")
def upstream():
    with Upstream() as upstream:
        yield upstream


@pytest.fixture(scope="module")
def limiter():
    service, rls = start_limiter()
    yield service, rls
    service.stop()
    service.directory.cleanup()


@pytest.fixture(scope="module")
def envoy(limiter, upstream):
    service, rls = limiter
    with Envoy(rls, upstream.port, token=service.token, callers=CALLERS) as envoy:
        yield envoy


def key_of(label: str) -> dict:
    """What a client sends: its API key, nothing of the limiter's."""
    return {"x-api-key": CALLERS[label].key}


def test_a_team_limit_of_n_lets_exactly_n_of_3n_requests_through(envoy, upstream):
    path = f"/{uuid.uuid4().hex}"
    answers = [envoy.get(path, key_of("exact")) for _ in range(3 * N)]
    assert [status for status, _, _ in answers] == [200] * N + [429] * (2 * N)
    assert upstream.hits.get(path, 0) == N
    for _, headers, _ in answers[N:]:
        assert int(headers["retry-after"]) > 0
        assert headers["ratelimit-policy"] == f'"team:fixed_window";q={N};w=3600, "global:token_bucket";q=100000;w=10'
        assert headers["ratelimit"].startswith('"team:fixed_window";r=0;t=')
    # Allowed answers carry the fields too, from the same decision.
    assert answers[0][1]["ratelimit"] == f'"team:fixed_window";r={N - 1}'


def test_grpc_through_envoy_and_rest_share_the_buckets(envoy, limiter):
    service, _ = limiter
    status, body = service.post("/api/v1/decisions", {"keys": {"team": CALLERS["shared"].team}, "cost": N - 1})
    assert status == 200 and body["allowed"]
    assert envoy.get("/", key_of("shared"))[0] == 200
    assert envoy.get("/", key_of("shared"))[0] == 429


def free_slots(service, team: str, expected: int, timeout: float = 10.0) -> int:
    """The team's free concurrency slots (a dry run's `remaining`), once they are `expected`
    or `timeout` seconds have passed: Envoy gives a slot back by a call of its own after the
    response has gone out, so the slot is free a moment after the client has its answer."""
    deadline = time.monotonic() + timeout
    while (free := team_remaining(service, team)) != expected and time.monotonic() < deadline:
        time.sleep(0.02)  # waiting for Envoy's call at the stream's end, not an edge under test
    return free


def test_a_slot_taken_reaches_the_upstream_as_its_lease_and_a_forged_one_does_not(envoy, limiter):
    status, _, body = envoy.get("/", {**key_of("slotted"), "x-limiter-lease": "forged"})
    assert status == 200
    lease = json.loads(body).get("x-limiter-lease")
    assert lease and lease != "forged"
    # Envoy gave the slot back when the response ended: releasing it over REST finds nothing.
    service, _ = limiter
    assert free_slots(service, "slotted", 1) == 1
    assert service.post(f"/api/v1/leases/{lease}/release", {})[0] == 404


def test_a_slot_comes_back_when_its_response_ends_and_not_before(envoy, limiter, upstream):
    """A concurrency limit of 2: two long requests are in, a third is refused; once the first
    has its answer, its slot comes back (Envoy's call at the stream's end), and a fourth gets
    in, whatever the upstream (ours never releases anything)."""
    service, _ = limiter
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(envoy.get, "/held/pair-1", key_of("pair"))
        assert upstream.arrived("pair-1")
        second = pool.submit(envoy.get, "/held/pair-2", key_of("pair"))
        assert upstream.arrived("pair-2")
        third = envoy.get("/", key_of("pair"))
        assert third[0] == 429 and "retry-after" in third[1]
        assert free_slots(service, "pair", 0, timeout=0) == 0
        upstream.finish("pair-1")
        assert first.result(10)[0] == 200
        assert free_slots(service, "pair", 1) == 1
        fourth = pool.submit(envoy.get, "/held/pair-4", key_of("pair"))
        assert upstream.arrived("pair-4")
        assert envoy.get("/", key_of("pair"))[0] == 429  # the second and the fourth hold both
        upstream.finish("pair-2")
        upstream.finish("pair-4")
        assert second.result(10)[0] == 200 and fourth.result(10)[0] == 200
    assert free_slots(service, "pair", 2) == 2


def test_a_client_that_goes_away_mid_request_gives_its_slot_back(envoy, limiter, upstream):
    service, _ = limiter
    with socket.create_connection(("127.0.0.1", envoy.port), timeout=10) as client:
        client.sendall(f"GET /held/gone HTTP/1.1\r\nHost: x\r\nx-api-key: {CALLERS['gone'].key}\r\n\r\n".encode())
        assert upstream.arrived("gone")
        assert free_slots(service, "gone", 1, timeout=0) == 1
    # Envoy resets the upstream stream, and the stream's end gives the slot back.
    assert free_slots(service, "gone", 2) == 2
    upstream.finish("gone")


@pytest.mark.parametrize(
    "headers",
    [{}, {"x-api-key": "key-nobody-knows"}, {"x-limiter-team": "t-of-a-guess"}],
    ids=["no key", "an unknown key", "the limiter's fields alone"],
)
def test_a_request_without_a_known_api_key_is_envoys_own_401(envoy, upstream, headers):
    path = f"/{uuid.uuid4().hex}"
    status, _, body = envoy.get(path, headers)
    assert (status, body, upstream.hits.get(path, 0)) == (401, b"Client authentication failed.", 0)


def test_a_wrong_token_is_refused_by_the_service_and_envoy_fails_open(limiter, upstream):
    _, rls = limiter
    with Envoy(rls, upstream.port, token="la_wrong_token", callers=CALLERS) as envoy:
        before = upstream.total
        answers = [envoy.get("/", key_of("token"))[0] for _ in range(N + 2)]
    # UNAUTHENTICATED is a failed call: failure_mode_deny false lets every request through.
    assert answers == [200] * (N + 2) and upstream.total - before == N + 2


@pytest.mark.parametrize("deny, expected", [(False, 200), (True, 503)])
def test_with_the_limiter_stopped_envoy_does_what_failure_mode_deny_says(upstream, deny, expected):
    service, rls = start_limiter()
    try:
        with Envoy(rls, upstream.port, failure_mode_deny=deny, token=service.token, callers=CALLERS) as envoy:
            assert [envoy.get("/", key_of("down"))[0] for _ in range(N + 1)] == [200] * N + [429]
            service.stop()
            before = upstream.total
            status, _, _ = envoy.get("/", key_of("down"))
            assert status == expected
            assert upstream.total - before == (1 if expected == 200 else 0)
    finally:
        service.stop()
        service.directory.cleanup()


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_a_clients_own_limiter_header_fields_change_nothing(envoy, limiter, upstream, forgery):
    """With a team limit of N, 3N requests that carry forged x-limiter-* fields let exactly N
    through, counted against the caller's own team at cost 1; the team they name is untouched,
    and the upstream sees the team Envoy knows the caller by, and none of the client's fields."""
    service, _ = limiter
    caller, victim = CALLERS[f"{forgery} caller"], CALLERS[f"{forgery} victim"]
    path = f"/{uuid.uuid4().hex}"
    headers = {"x-api-key": caller.key, "x-limiter-team": caller.team, **FORGERIES[forgery](victim)}
    answers = [envoy.get(path, headers) for _ in range(3 * N)]
    outcome = {
        "statuses": [status for status, _, _ in answers],
        "through": upstream.hits.get(path, 0),
        "caller's team left": team_remaining(service, caller.team),
        "victim's team left": team_remaining(service, victim.team),
    }
    assert outcome == {
        "statuses": [200] * N + [429] * (2 * N),
        "through": N,
        "caller's team left": 0,
        "victim's team left": N,
    }
    seen = json.loads(answers[0][2])
    assert seen == {"x-limiter-team": caller.team, "x-limiter-cost": "1"}
