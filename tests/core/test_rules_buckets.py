"""Bucket-shaped rules: the token bucket and GCRA."""

import math
import random

import pytest

from core import HierarchicalLimiter, ManualClock, MemoryStore

from .helpers import TICK, allowed_in_a_row, gcra, move_to, state_of, token_bucket

# --- token bucket --------------------------------------------------------------------------


def test_a_token_comes_back_exactly_when_the_refill_says_and_not_a_tick_before(build, clock):
    limiter = build({"user": [token_bucket(2, 1)]})
    keys = {"user": "u"}
    assert allowed_in_a_row(limiter, keys, 2) == [True, True]
    assert limiter.acquire(keys).retry_after == 1.0
    move_to(clock, 1 - TICK)
    assert not limiter.acquire(keys).allowed
    move_to(clock, 1)
    assert allowed_in_a_row(limiter, keys, 2) == [True, False]


def test_a_bucket_refills_no_further_than_its_capacity(build, clock):
    limiter = build({"user": [token_bucket(2, 1)]})
    allowed_in_a_row(limiter, {"user": "u"}, 2)
    clock.advance(1000)
    assert state_of(limiter, "user", "u")["tokens"] == 2.0
    assert allowed_in_a_row(limiter, {"user": "u"}, 3) == [True, True, False]


def test_a_cost_above_one_takes_that_many_tokens_and_waits_for_the_missing_ones(build, clock):
    limiter = build({"user": [token_bucket(10, 2)]})
    keys = {"user": "u"}
    assert limiter.acquire(keys, cost=4).remaining == 6.0
    assert limiter.acquire(keys, cost=4).remaining == 2.0
    denied = limiter.acquire(keys, cost=4)
    assert not denied.allowed
    assert denied.retry_after == 1.0  # 2 missing tokens at 2 per second
    move_to(clock, 1 - TICK)
    assert not limiter.acquire(keys, cost=4).allowed
    move_to(clock, 1)
    assert limiter.acquire(keys, cost=4).remaining == 0.0


def test_a_cost_equal_to_the_capacity_fits_a_full_bucket(build):
    limiter = build({"user": [token_bucket(10, 2)]})
    assert limiter.acquire({"user": "u"}, cost=10).allowed


def test_a_cost_above_the_capacity_is_refused_for_good_and_takes_nothing(build):
    limiter = build({"user": [token_bucket(10, 2)]})
    decision = limiter.acquire({"user": "u"}, cost=10.5)
    assert not decision.allowed
    assert decision.reason == "COST_EXCEEDS_LIMIT"
    assert decision.retry_after == math.inf
    assert decision.blocked_by == "user: token_bucket(10, 2/s)"
    assert limiter.acquire({"user": "u"}, cost=10).allowed


def test_a_bucket_that_never_refills_denies_for_ever_once_empty(build, clock):
    limiter = build({"user": [token_bucket(1, 0)]})
    limiter.acquire({"user": "u"})
    denied = limiter.acquire({"user": "u"})
    assert denied.retry_after == math.inf
    assert denied.reason == "RATE_LIMITED"  # it could fit a full bucket: not a too-big cost
    clock.advance(1e6)
    assert not limiter.acquire({"user": "u"}).allowed


def test_emptying_one_keys_bucket_leaves_the_others_full(build):
    limiter = build({"user": [token_bucket(2, 1)]})
    allowed_in_a_row(limiter, {"user": "a"}, 2)
    assert not limiter.acquire({"user": "a"}).allowed
    assert limiter.acquire({"user": "b"}).remaining == 1.0


def test_a_bucket_that_counts_requests_takes_one_token_whatever_the_cost(build):
    limiter = build({"user": [token_bucket(2, 1, counts="requests")]})
    assert allowed_in_a_row(limiter, {"user": "u"}, 3, cost=500) == [True, True, False]
    assert limiter.inspect("user", "u")[0]["rule"] == "token_bucket(2, 1/s) per request"


def test_inspect_says_when_a_bucket_is_full_again(build):
    limiter = build({"user": [token_bucket(10, 2)]})
    limiter.acquire({"user": "u"}, cost=4)
    state = state_of(limiter, "user", "u")
    assert state == {"tokens": 6.0, "capacity": 10.0, "remaining": 6.0, "full_in": 2.0, "debt_clears_in": 0.0}


# --- GCRA ----------------------------------------------------------------------------------


def test_gcra_admits_its_burst_at_once_then_one_per_interval(build, clock):
    limiter = build({"user": [gcra(2, 4)]})
    keys = {"user": "u"}
    assert allowed_in_a_row(limiter, keys, 4) == [True] * 4
    denied = limiter.acquire(keys)
    assert not denied.allowed
    assert denied.retry_after == 0.5
    assert denied.blocked_by == "user: gcra(2/s, burst 4)"
    move_to(clock, 0.5 - TICK)
    assert not limiter.acquire(keys).allowed
    move_to(clock, 0.5)
    assert allowed_in_a_row(limiter, keys, 2) == [True, False]


def test_gcra_charges_a_cost_above_one_as_that_many_intervals(build, clock):
    limiter = build({"user": [gcra(2, 4)]})
    keys = {"user": "u"}
    assert limiter.acquire(keys, cost=3).remaining == 1.0
    denied = limiter.acquire(keys, cost=2)
    assert denied.retry_after == 0.5  # one unit over, at 0.5 s per unit
    move_to(clock, 0.5 - TICK)
    assert not limiter.acquire(keys, cost=2).allowed
    move_to(clock, 0.5)
    assert limiter.acquire(keys, cost=2).remaining == 0.0


def test_gcra_refuses_a_cost_above_its_burst_for_good(build):
    limiter = build({"user": [gcra(2, 4)]})
    decision = limiter.acquire({"user": "u"}, cost=5)
    assert decision.reason == "COST_EXCEEDS_LIMIT"
    assert decision.retry_after == math.inf
    assert limiter.acquire({"user": "u"}, cost=4).allowed


def test_gcra_keys_do_not_share_a_burst(build):
    limiter = build({"user": [gcra(1, 2)]})
    allowed_in_a_row(limiter, {"user": "a"}, 2)
    assert not limiter.acquire({"user": "a"}).allowed
    assert allowed_in_a_row(limiter, {"user": "b"}, 3) == [True, True, False]


def test_gcra_gives_back_no_more_than_its_burst_after_a_quiet_spell(build, clock):
    limiter = build({"user": [gcra(2, 4)]})
    allowed_in_a_row(limiter, {"user": "u"}, 4)
    clock.advance(3600)
    assert allowed_in_a_row(limiter, {"user": "u"}, 5) == [True] * 4 + [False]


@pytest.mark.parametrize("seed", range(5))
def test_gcra_admits_exactly_what_the_equivalent_token_bucket_admits(seed):
    # rate 2 and steps of 0.25 s keep both algorithms' arithmetic exact in binary floats.
    clock = ManualClock()
    bucket = HierarchicalLimiter.from_config({"k": [token_bucket(4, 2)]}, MemoryStore(), clock)
    cell = HierarchicalLimiter.from_config({"k": [gcra(2, 4)]}, MemoryStore(), clock)
    steps = random.Random(seed)
    for _ in range(300):
        clock.advance(steps.choice([0, 0, 0.25, 0.5, 1.25]))
        cost = steps.choice([1, 1, 2, 3, 4])
        by_bucket, by_cell = bucket.acquire({"k": "x"}, cost), cell.acquire({"k": "x"}, cost)
        assert (by_bucket.allowed, by_bucket.retry_after) == (by_cell.allowed, by_cell.retry_after)


@pytest.mark.parametrize("capacity, per_second", [(3, 3), (7, 7 / 3), (13, 0.7), (50, 10)])
def test_a_full_bucket_admits_its_whole_burst_at_epoch_times(build, clock, capacity, per_second):
    # Epoch seconds (what Redis TIME gives) are doubles exact to ~0.25 us, and full_at keeps
    # whole microseconds: the last token of a burst must not be lost to that rounding.
    limiter = build({"user": [token_bucket(capacity, per_second)]})
    clock.advance(1_780_272_000.123456)
    for spell in range(20):
        clock.advance(capacity / per_second + 0.0137 * spell)  # full again, and then some
        burst = allowed_in_a_row(limiter, {"user": "u"}, capacity + 1)
        assert burst == [True] * capacity + [False], spell
