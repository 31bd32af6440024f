"""Envoy's rate limit service over gRPC (policies/rls_service.py), called through a real gRPC
channel: its answers, its refusals and the service token it may require."""

import os
import subprocess
import sys

import grpc
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from core.stats import DenialStats
from policies.compile import PolicyCache, install_policy_cache
from policies.rls_service import is_loopback, start_server
from policies.telemetry import install_denial_stats
from tests.api.conftest import make_token

Response = rls_pb2.RateLimitResponse


def ask(team="t1", domain="limiter", hits=0):
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="team", value=team)
    return rls_pb2.RateLimitRequest(
        domain=domain, descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])], hits_addend=hits
    )


@pytest.fixture
def service(transactional_db, load, policy, store, clock, settings):
    """The gRPC service on a free loopback port, deciding the example policy (the free tier's
    team: 2 a minute) on an in-process store; yields a stub on a channel to it. No token is
    required (loopback may serve so) unless a test says otherwise."""
    settings.LIMITER_RLS_REQUIRE_TOKEN = False
    policy["tiers"]["free"]["team"] = [{"type": "fixed_window", "limit": 2, "window": 60}]
    install_policy_cache(PolicyCache(store=store, clock=clock, limiter_clock=clock))
    install_denial_stats(DenialStats(clock=clock, flush_every=None))
    load(policy)
    server = start_server("127.0.0.1:0")
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    yield rls_pb2_grpc.RateLimitServiceStub(channel)
    channel.close()
    server.stop(grace=None)
    install_policy_cache(None)
    install_denial_stats(None)


def test_it_answers_ok_then_over_limit_with_the_rate_limit_fields(service):
    answers = [service.ShouldRateLimit(ask(), timeout=5) for _ in range(3)]
    assert [a.overall_code for a in answers] == [Response.OK, Response.OK, Response.OVER_LIMIT]
    over = answers[2]
    assert [s.code for s in over.statuses] == [Response.OVER_LIMIT]
    assert over.statuses[0].current_limit.requests_per_unit == 2
    fields = {h.key: h.value for h in over.response_headers_to_add}
    assert set(fields) == {"RateLimit-Policy", "RateLimit", "Retry-After"}
    assert fields["RateLimit-Policy"] == '"team:fixed_window";q=2;w=60'


def test_a_request_that_is_not_one_decision_is_invalid_argument_saying_why(service):
    with pytest.raises(grpc.RpcError) as refused:
        service.ShouldRateLimit(ask(domain="other"), timeout=5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "domain: must be 'limiter' (LIMITER_RLS_DOMAIN), got 'other'"
    with pytest.raises(grpc.RpcError) as empty:
        service.ShouldRateLimit(rls_pb2.RateLimitRequest(domain="limiter"), timeout=5)
    assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "descriptors: must hold at least one descriptor" in empty.value.details()


def test_the_domain_is_read_from_the_settings(service, settings):
    settings.LIMITER_RLS_DOMAIN = "edge"
    assert service.ShouldRateLimit(ask(domain="edge"), timeout=5).overall_code == Response.OK
    with pytest.raises(grpc.RpcError) as refused:
        service.ShouldRateLimit(ask(domain="limiter"), timeout=5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_with_a_token_required_a_call_must_carry_a_deciding_token(service, settings):
    settings.LIMITER_RLS_REQUIRE_TOKEN = True
    decide, admin = make_token("decide", "envoy"), make_token("admin", "ops")
    for metadata, words in [
        ((), "needs metadata authorization"),
        ((("authorization", "Bearer la_nothing_such"),), "unknown or revoked token"),
        ((("authorization", "Basic abc"),), "needs metadata authorization"),
    ]:
        with pytest.raises(grpc.RpcError) as refused:
            service.ShouldRateLimit(ask(), metadata=metadata, timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert words in refused.value.details()
    for token in (decide, admin):
        answer = service.ShouldRateLimit(ask(), metadata=(("authorization", f"Bearer {token}"),), timeout=5)
        assert answer.overall_code == Response.OK


def test_without_a_token_required_no_metadata_is_needed(service):
    assert service.ShouldRateLimit(ask(), timeout=5).overall_code == Response.OK


def test_a_token_is_required_unless_the_settings_say_otherwise():
    environment = {k: v for k, v in os.environ.items() if k != "LIMITER_RLS_REQUIRE_TOKEN"}
    shown = subprocess.run(
        [sys.executable, "-c", "import limiter_admin.settings as s; print(s.LIMITER_RLS_REQUIRE_TOKEN)"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.stdout.strip() == "True", shown.stderr


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("[::]", False),
        ("10.0.0.5", False),
        ("envoy.internal", False),
        ("", False),
    ],
)
def test_only_loopback_addresses_count_as_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_without_a_token_required_only_loopback_is_served(settings):
    settings.LIMITER_RLS_REQUIRE_TOKEN = False
    refusal = "refusing to serve Envoy's rate limit service on '0.0.0.0:0' without a token"
    with pytest.raises(RuntimeError, match=refusal):
        start_server("0.0.0.0:0")
    settings.LIMITER_RLS_REQUIRE_TOKEN = True
    server = start_server("0.0.0.0:0")
    server.stop(grace=None)


def test_a_bind_address_already_taken_is_an_error_naming_it(service):
    first = start_server("127.0.0.1:0")
    try:
        with pytest.raises(RuntimeError, match=f"127.0.0.1:{first.port}"):
            start_server(f"127.0.0.1:{first.port}")
    finally:
        first.stop(grace=None)


def test_a_check_that_cannot_reach_the_store_is_unavailable(
    transactional_db, load, policy, unreachable_redis_url, settings
):
    from core.stores.redis import RedisStore

    settings.LIMITER_RLS_REQUIRE_TOKEN = False
    store = RedisStore(url=unreachable_redis_url)
    install_policy_cache(PolicyCache(store=store))
    load(policy)
    server = start_server("127.0.0.1:0")
    request = ask(team="acme")
    request.descriptors[0].hits_addend.value = 0  # check only: no fail mode answers for it
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.ShouldRateLimit(request, timeout=10)
            # A taking request is decided by the levels' fail modes (open here) instead.
            assert stub.ShouldRateLimit(ask(team="acme"), timeout=10).overall_code == Response.OK
    finally:
        server.stop(grace=None)
        install_policy_cache(None)
        store.close()
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "cannot decide now" in refused.value.details()
