"""The single-level facade for middleware: `allow_request(client_id) -> bool`."""

import math

import pytest

from core import ClientLimiter, Decision, MemoryStore

from .helpers import fixed_window, gcra, sliding_window, sliding_window_counter, token_bucket

# Middleware sees only allow_request; any of these may stand behind it.
THREE_PER_MINUTE = {
    "token_bucket": token_bucket(3, 3 / 60),
    "gcra": gcra(3 / 60, 3),
    "sliding_window": sliding_window(3, 60),
    "sliding_window_counter": sliding_window_counter(3, 60),
    "fixed_window": fixed_window(3, 60),
}


def middleware(limiter, client_id):
    return 200 if limiter.allow_request(client_id) else 429


@pytest.mark.parametrize("spec", THREE_PER_MINUTE.values(), ids=THREE_PER_MINUTE.keys())
def test_swapping_the_algorithm_changes_no_call_site(clock, spec):
    limiter = ClientLimiter(spec, clock=clock)
    assert [middleware(limiter, "key-1") for _ in range(4)] == [200, 200, 200, 429]
    assert middleware(limiter, "key-2") == 200


def test_allow_request_answers_a_plain_bool(clock):
    limiter = ClientLimiter(token_bucket(1, 1), clock=clock)
    assert limiter.allow_request("c") is True
    assert limiter.allow_request("c") is False


def test_a_client_gets_its_tokens_back_with_time(clock):
    limiter = ClientLimiter(token_bucket(2, 1), clock=clock)
    assert [limiter.allow_request("c") for _ in range(3)] == [True, True, False]
    clock.advance(1)
    assert [limiter.allow_request("c") for _ in range(2)] == [True, False]


def test_decide_gives_the_full_decision_for_a_retry_after_header(clock):
    limiter = ClientLimiter(token_bucket(1, 0.5), clock=clock)
    limiter.allow_request("c")
    decision = limiter.decide("c")
    assert isinstance(decision, Decision)
    assert not decision.allowed
    assert decision.retry_after == 2.0


def test_several_rules_all_apply(clock):
    limiter = ClientLimiter([token_bucket(10, 1), sliding_window(2, 60)], clock=clock)
    assert [limiter.allow_request("c") for _ in range(3)] == [True, True, False]


def test_a_cost_is_passed_through(clock):
    limiter = ClientLimiter(token_bucket(5, 1), clock=clock)
    assert limiter.allow_request("c", cost=5) is True
    assert limiter.allow_request("c", cost=1) is False
    assert limiter.decide("d", cost=6).retry_after == math.inf


def test_it_keeps_its_state_in_the_store_it_is_given(clock):
    store = MemoryStore()
    limiter = ClientLimiter(token_bucket(5, 1), store=store, clock=clock)
    limiter.allow_request("a")
    limiter.allow_request("b")
    assert len(store) == 2
