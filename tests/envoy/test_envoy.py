"""A real Envoy, configured as docs/GATEWAYS.md says, in front of a small upstream, its HTTP
ratelimit filter asking the real service's gRPC endpoint (gunicorn with RLS_BIND, as
`make run` serves it; service tokens required)."""

import copy
import json

import grpc
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from tests.envoy.gateway import Envoy, Upstream
from tests.policies.conftest import POLICY
from tests.serving import Service, free_port

N = 5


def policy() -> dict:
    doc = copy.deepcopy(POLICY)
    doc["tiers"]["free"]["team"] = [{"type": "fixed_window", "limit": N, "window": 3600}]
    doc["tiers"]["slots"] = {"team": [{"type": "concurrency", "limit": 1, "lease": 60}]}
    doc["tenants"]["slotted"] = {"tier": "slots"}
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
    with Envoy(rls, upstream.port, token=service.token) as envoy:
        yield envoy


def test_a_team_limit_of_n_lets_exactly_n_of_3n_requests_through(envoy, upstream):
    before = upstream.total
    answers = [envoy.get("/work", {"x-limiter-team": "t-exact"}) for _ in range(3 * N)]
    assert [status for status, _, _ in answers] == [200] * N + [429] * (2 * N)
    assert upstream.total - before == N
    for _, headers, _ in answers[N:]:
        assert int(headers["retry-after"]) > 0
        assert headers["ratelimit-policy"] == f'"team:fixed_window";q={N};w=3600, "global:token_bucket";q=100000;w=10'
        assert headers["ratelimit"].startswith('"team:fixed_window";r=0;t=')
    # Allowed answers carry the fields too, from the same decision.
    assert answers[0][1]["ratelimit"] == f'"team:fixed_window";r={N - 1}'


def test_the_cost_header_is_the_cost_and_a_missing_one_costs_1(envoy):
    assert envoy.get("/", {"x-limiter-team": "t-cost", "x-limiter-cost": "3"})[1]["ratelimit"].endswith(f"r={N - 3}")
    assert envoy.get("/", {"x-limiter-team": "t-cost"})[1]["ratelimit"].endswith(f"r={N - 4}")
    status, headers, _ = envoy.get("/", {"x-limiter-team": "t-cost", "x-limiter-cost": "2"})
    assert status == 429 and headers["ratelimit"].startswith('"team:fixed_window";r=1;t=')


def test_grpc_through_envoy_and_rest_share_the_buckets(envoy, limiter):
    service, _ = limiter
    status, body = service.post("/api/v1/decisions", {"keys": {"team": "t-shared"}, "cost": N - 1})
    assert status == 200 and body["allowed"]
    assert envoy.get("/", {"x-limiter-team": "t-shared"})[0] == 200
    assert envoy.get("/", {"x-limiter-team": "t-shared"})[0] == 429


def test_a_slot_taken_reaches_the_upstream_as_its_lease_and_a_forged_one_does_not(envoy, limiter):
    status, _, body = envoy.get("/", {"x-limiter-team": "slotted", "x-limiter-lease": "forged"})
    assert status == 200
    lease = json.loads(body).get("x-limiter-lease")
    assert lease and lease != "forged"
    status, headers, _ = envoy.get("/", {"x-limiter-team": "slotted"})
    assert status == 429 and "retry-after" in headers
    # The upstream, done, gives the slot back over REST: the next request goes through.
    service, _ = limiter
    assert service.post(f"/api/v1/leases/{lease}/release", {})[0] == 200
    assert envoy.get("/", {"x-limiter-team": "slotted"})[0] == 200


def test_without_a_team_header_the_global_level_alone_decides(envoy, upstream):
    status, headers, _ = envoy.get("/", {"x-limiter-user": "u-alone"})
    assert status == 200
    assert headers["ratelimit-policy"].startswith('"global:token_bucket"')


def test_a_wrong_token_is_refused_by_the_service_and_envoy_fails_open(limiter, upstream):
    _, rls = limiter
    with Envoy(rls, upstream.port, token="la_wrong_token") as envoy:
        before = upstream.total
        answers = [envoy.get("/", {"x-limiter-team": "t-token"})[0] for _ in range(N + 2)]
    # UNAUTHENTICATED is a failed call: failure_mode_deny false lets every request through.
    assert answers == [200] * (N + 2) and upstream.total - before == N + 2


@pytest.mark.parametrize("deny, expected", [(False, 200), (True, 503)])
def test_with_the_limiter_stopped_envoy_does_what_failure_mode_deny_says(upstream, deny, expected):
    service, rls = start_limiter()
    try:
        with Envoy(rls, upstream.port, failure_mode_deny=deny, token=service.token) as envoy:
            assert [envoy.get("/", {"x-limiter-team": "t-down"})[0] for _ in range(N + 1)] == [200] * N + [429]
            service.stop()
            before = upstream.total
            status, _, _ = envoy.get("/", {"x-limiter-team": "t-down"})
            assert status == expected
            assert upstream.total - before == (1 if expected == 200 else 0)
    finally:
        service.stop()
        service.directory.cleanup()


def test_a_cost_that_is_no_number_makes_envoy_skip_the_limiter(envoy, upstream):
    """Envoy's own behaviour, documented in docs/GATEWAYS.md: it drops a descriptor whose
    hits_addend is no number, so no call is made and the request is not limited; a
    fraction is cut to its whole part."""
    for cost in ("abc", "-1"):
        status, headers, _ = envoy.get("/", {"x-limiter-team": "t-garbage", "x-limiter-cost": cost})
        assert status == 200 and "ratelimit" not in headers
    status, headers, _ = envoy.get("/", {"x-limiter-team": "t-garbage", "x-limiter-cost": "1.5"})
    assert headers["ratelimit"] == f'"team:fixed_window";r={N - 1}'
