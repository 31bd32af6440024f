"""OpenAI's x-ratelimit-* header fields (policies/services/openai_headers.py), with
LIMITER_OPENAI_HEADERS on: from the rules that count requests and those that count tokens,
on REST decisions, forward-auth and Envoy's rate limit service; none when it is off."""

import pytest
from django.test import Client
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2

from core import HierarchicalLimiter
from core.stores.redis import RedisStore
from policies.services.openai_headers import duration_text, openai_headers
from policies.services.rls import should_rate_limit

from .conftest import make_token

# user: 5 requests a minute, and a token bucket of 500 refilling 10/s; team: 1000 tokens an
# hour (a fixed window) and a day's quota of 5000; a concurrency rule, which is not stated.
POLICY = {
    "default_tier": "t",
    "levels": [{"name": "user"}, {"name": "team"}],
    "tiers": {
        "t": {
            "user": [
                {"type": "fixed_window", "limit": 5, "window": 60, "counts": "requests"},
                {"type": "token_bucket", "capacity": 500, "per_second": 10},
            ],
            "team": [
                {"type": "fixed_window", "limit": 1000, "window": 3600},
                {"type": "quota", "limit": 5000, "period": "day"},
                {"type": "concurrency", "limit": 50, "lease": 30},
            ],
        }
    },
}
KEYS = {"user": "u1", "team": "lab"}
FIELDS = ("limit", "remaining", "reset")


@pytest.fixture
def openai(memory_engine, load, settings):
    settings.LIMITER_OPENAI_HEADERS = True
    load(POLICY)
    return make_token("decide")


def decide(token, cost):
    return Client().post(
        "/api/v1/decisions",
        {"keys": KEYS, "cost": cost},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def stated(response_headers):
    return {
        f"{field}-{kind}": response_headers.get(f"x-ratelimit-{field}-{kind}")
        for kind in ("requests", "tokens")
        for field in FIELDS
    }


def test_a_decision_states_the_tightest_requests_and_tokens_rules(openai, clock):
    first = decide(openai, 100)
    assert stated(first.headers) == {
        # The minute's window (the clock stands at a whole minute): 4 of 5 left, a minute to go.
        "limit-requests": "5",
        "remaining-requests": "4",
        "reset-requests": "1m0s",
        # The user's bucket is the tighter of the token rules: 400 of 500, full in 10 s.
        "limit-tokens": "500",
        "remaining-tokens": "400",
        "reset-tokens": "10s",
    }
    clock.advance(2.5)
    second = decide(openai, 380)
    assert stated(second.headers)["remaining-tokens"] == "45"  # 400 + 25 refilled - 380
    assert stated(second.headers)["reset-tokens"] == "45.5s"
    assert stated(second.headers)["reset-requests"] == "57.5s"


def test_a_denial_states_the_rooms_too_and_nothing_was_taken(openai):
    for _ in range(5):
        decide(openai, 1)
    denied = decide(openai, 1)
    assert denied.json()["allowed"] is False
    assert stated(denied.headers)["remaining-requests"] == "0"
    assert stated(denied.headers)["remaining-tokens"] == "495"


def test_when_the_team_is_tighter_its_rule_is_stated(openai):
    for user, cost in (("u1", 450), ("u2", 450), ("u3", 50)):  # the team's hour: 50 left
        answer = Client().post(
            "/api/v1/decisions",
            {"keys": {"user": user, "team": "lab"}, "cost": cost},
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {openai}",
        )
    fields = stated(answer.headers)  # u3's bucket has 450 left
    assert (fields["limit-tokens"], fields["remaining-tokens"], fields["reset-tokens"]) == ("1000", "50", "1h0m0s")


def test_forward_auth_and_envoys_answers_carry_them(openai):
    authz = Client().get(
        "/api/v1/authz",
        HTTP_AUTHORIZATION=f"Bearer {openai}",
        HTTP_X_LIMITER_USER="u1",
        HTTP_X_LIMITER_TEAM="lab",
        HTTP_X_LIMITER_COST="7",
    )
    assert stated(authz.headers)["remaining-tokens"] == "493"
    entries = [ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in KEYS.items()]
    request = rls_pb2.RateLimitRequest(
        domain="limiter", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=entries)], hits_addend=3
    )
    envoy = {h.key: h.value for h in should_rate_limit(request).response.response_headers_to_add}
    assert stated(envoy)["remaining-tokens"] == "490" and stated(envoy)["remaining-requests"] == "3"


def test_they_are_off_by_default(memory_engine, load):
    load(POLICY)
    answer = decide(make_token("decide"), 1)
    assert answer.status_code == 200 and "RateLimit" in answer.headers
    assert not [name for name in answer.headers if name.lower().startswith("x-ratelimit-")]


def test_a_store_that_does_not_answer_leaves_them_out(unreachable_redis_url):
    store = RedisStore(url=unreachable_redis_url)
    try:
        limiter = HierarchicalLimiter.from_config(
            {"user": [{"type": "token_bucket", "capacity": 5, "per_second": 1}]}, store=store
        )
        assert openai_headers(limiter, {"user": "u1"}) == {}
    finally:
        store.close()


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0, "0s"),
        (0.02, "20ms"),
        (0.0201, "21ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (59.5, "59.5s"),
        (59.9994, "1m0s"),  # rounded up: the room is back by then
        (360, "6m0s"),
        (3725.25, "1h2m5.25s"),
        (-3, "0s"),
    ],
)
def test_a_reset_is_spelt_as_openai_does(seconds, text):
    assert duration_text(seconds) == text
