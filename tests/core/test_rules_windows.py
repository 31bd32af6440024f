"""Window-shaped rules: fixed window, sliding-window log and sliding-window counter."""

import math

import pytest

from .helpers import TICK, allowed_in_a_row, fixed_window, move_to, sliding_window, sliding_window_counter, state_of

WINDOWS = {
    "fixed_window": fixed_window,
    "sliding_window": sliding_window,
    "sliding_window_counter": sliding_window_counter,
}


@pytest.mark.parametrize("make", WINDOWS.values(), ids=WINDOWS.keys())
def test_a_window_refuses_a_cost_above_its_limit_for_good_and_takes_nothing(build, make):
    limiter = build({"user": [make(3, 60)]})
    decision = limiter.acquire({"user": "u"}, cost=4)
    assert not decision.allowed
    assert decision.reason == "COST_EXCEEDS_LIMIT"
    assert decision.retry_after == math.inf
    assert decision.blocked_by == f"user: {make.__name__}(3/60s)"
    assert limiter.acquire({"user": "u"}, cost=3).allowed


@pytest.mark.parametrize("make", WINDOWS.values(), ids=WINDOWS.keys())
def test_filling_one_keys_window_leaves_the_others_empty(build, make):
    limiter = build({"user": [make(2, 60)]})
    assert allowed_in_a_row(limiter, {"user": "a"}, 3) == [True, True, False]
    assert allowed_in_a_row(limiter, {"user": "b"}, 3) == [True, True, False]


@pytest.mark.parametrize("make", WINDOWS.values(), ids=WINDOWS.keys())
def test_a_window_that_counts_requests_takes_one_whatever_the_cost(build, make):
    limiter = build({"user": [make(2, 60, counts="requests")]})
    assert allowed_in_a_row(limiter, {"user": "u"}, 3, cost=1000) == [True, True, False]


# --- fixed window --------------------------------------------------------------------------


def test_a_fixed_window_opens_exactly_at_the_next_window_and_not_a_tick_before(build, clock):
    limiter = build({"user": [fixed_window(3, 60)]})
    keys = {"user": "u"}
    move_to(clock, 30)
    assert allowed_in_a_row(limiter, keys, 3) == [True] * 3
    assert limiter.acquire(keys).retry_after == 30.0
    move_to(clock, 60 - TICK)
    assert not limiter.acquire(keys).allowed
    move_to(clock, 60)
    assert allowed_in_a_row(limiter, keys, 4) == [True] * 3 + [False]


def test_a_fixed_window_admits_twice_its_limit_across_the_boundary(build, clock):
    limiter = build({"user": [fixed_window(3, 60)]})
    move_to(clock, 59.5)
    first = allowed_in_a_row(limiter, {"user": "u"}, 4)
    move_to(clock, 60)
    second = allowed_in_a_row(limiter, {"user": "u"}, 4)
    assert first.count(True) + second.count(True) == 6  # in half a second


def test_a_fixed_window_counts_cost_and_lets_a_smaller_request_use_what_is_left(build, clock):
    limiter = build({"user": [fixed_window(5, 60)]})
    keys = {"user": "u"}
    assert limiter.acquire(keys, cost=3).remaining == 2.0
    move_to(clock, 10)
    denied = limiter.acquire(keys, cost=3)
    assert not denied.allowed and denied.retry_after == 50.0
    assert limiter.acquire(keys, cost=2).remaining == 0.0


# --- sliding-window log --------------------------------------------------------------------


def test_a_sliding_log_entry_leaves_exactly_one_window_after_it_came(build, clock):
    limiter = build({"user": [sliding_window(3, 10)]})
    keys = {"user": "u"}
    for t in (0, 1, 2):
        move_to(clock, t)
        assert limiter.acquire(keys).allowed
    move_to(clock, 5)
    assert limiter.acquire(keys).retry_after == 5.0
    move_to(clock, 10 - TICK)
    assert not limiter.acquire(keys).allowed
    move_to(clock, 10)
    assert limiter.acquire(keys).allowed
    assert limiter.acquire(keys).retry_after == 1.0  # now the entry of t=1 is the oldest


def test_a_sliding_log_has_no_burst_at_a_window_boundary(build, clock):
    limiter = build({"user": [sliding_window(3, 60)]})
    move_to(clock, 59.5)
    allowed_in_a_row(limiter, {"user": "u"}, 3)
    move_to(clock, 60)
    denied = limiter.acquire({"user": "u"})
    assert not denied.allowed
    assert denied.retry_after == 59.5


def test_a_sliding_log_waits_until_enough_cost_has_left_the_window(build, clock):
    limiter = build({"user": [sliding_window(3, 10)]})
    keys = {"user": "u"}
    limiter.acquire(keys, cost=1)
    move_to(clock, 4)
    limiter.acquire(keys, cost=2)
    move_to(clock, 5)
    # Two units must leave: the 1 of t=0 is not enough, the 2 of t=4 is.
    assert limiter.acquire(keys, cost=2).retry_after == 9.0
    move_to(clock, 14 - TICK)
    assert not limiter.acquire(keys, cost=2).allowed
    move_to(clock, 14)
    assert limiter.acquire(keys, cost=2).allowed


def test_a_sliding_log_keeps_one_entry_per_admitted_request_in_the_window(build, clock):
    limiter = build({"user": [sliding_window(10, 10)]})
    for t in range(5):
        move_to(clock, t)
        limiter.acquire({"user": "u"}, cost=2)
    move_to(clock, 11.5)
    state = state_of(limiter, "user", "u")
    assert (state["entries"], state["used"], state["remaining"]) == (3, 6.0, 4.0)


# --- sliding-window counter ----------------------------------------------------------------


def test_a_sliding_counter_weighs_the_previous_window_and_opens_exactly_on_time(build, clock):
    limiter = build({"user": [sliding_window_counter(4, 10)]})
    keys = {"user": "u"}
    assert allowed_in_a_row(limiter, keys, 4) == [True] * 4
    # Next window the 4 weigh 4 x (1 - elapsed / 10); one more fits once that is 3.
    assert limiter.acquire(keys).retry_after == 12.5
    move_to(clock, 12.5 - TICK)
    assert not limiter.acquire(keys).allowed
    move_to(clock, 12.5)
    assert allowed_in_a_row(limiter, keys, 2) == [True, False]


def test_a_sliding_counter_computes_the_wait_from_inside_the_next_window(build, clock):
    limiter = build({"user": [sliding_window_counter(4, 10)]})
    allowed_in_a_row(limiter, {"user": "u"}, 4)
    move_to(clock, 10)
    assert limiter.acquire({"user": "u"}).retry_after == 2.5


def test_a_sliding_counter_waits_for_a_cost_above_one(build, clock):
    limiter = build({"user": [sliding_window_counter(8, 10)]})
    keys = {"user": "u"}
    limiter.acquire(keys, cost=4)
    move_to(clock, 10)
    denied = limiter.acquire(keys, cost=6)
    assert denied.retry_after == 5.0  # 4 x 0.5 + 6 = 8 at t=15
    move_to(clock, 15 - TICK)
    assert not limiter.acquire(keys, cost=6).allowed
    move_to(clock, 15)
    assert limiter.acquire(keys, cost=6).allowed


def test_a_sliding_counter_has_no_full_burst_at_a_window_boundary(build, clock):
    limiter = build({"user": [sliding_window_counter(4, 10)]})
    move_to(clock, 9.5)
    allowed_in_a_row(limiter, {"user": "u"}, 4)
    move_to(clock, 10)
    assert not limiter.acquire({"user": "u"}).allowed


def test_a_sliding_counter_over_admits_only_what_the_weight_discounts(build, clock):
    # The accepted trade-off: a burst at the end of a window is taken as spread evenly.
    limiter = build({"user": [sliding_window_counter(4, 10)]})
    move_to(clock, 9.5)
    allowed_in_a_row(limiter, {"user": "u"}, 4)
    move_to(clock, 15)
    assert allowed_in_a_row(limiter, {"user": "u"}, 3) == [True, True, False]


def test_a_sliding_counter_forgets_a_window_two_windows_ago(build, clock):
    limiter = build({"user": [sliding_window_counter(4, 10)]})
    allowed_in_a_row(limiter, {"user": "u"}, 4)
    move_to(clock, 20)
    assert allowed_in_a_row(limiter, {"user": "u"}, 5) == [True] * 4 + [False]
