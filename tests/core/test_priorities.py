"""Priority classes: a class must leave `watermark x capacity` untouched at its levels."""

import pytest

from core import InvalidRequest

from .helpers import (
    allowed_in_a_row,
    concurrency,
    fixed_window,
    gcra,
    sliding_window,
    sliding_window_counter,
    token_bucket,
)

PRIORITIES = {"batch": {"watermark": 0.2, "levels": ["global"]}, "interactive": {"watermark": 0}}


def use_up(limiter, n):
    """Spend `n` of the global capacity, each from its own user."""
    for i in range(n):
        assert limiter.acquire({"user": f"filler-{i}", "global": "*"}).allowed


def test_batch_is_denied_once_eight_of_ten_are_used_while_interactive_gets_the_last_two(build):
    limiter = build({"user": [token_bucket(10, 1)], "global": [token_bucket(10, 1)]}, PRIORITIES)
    keys = {"user": "u", "global": "*"}
    use_up(limiter, 8)
    batch = limiter.acquire(keys, priority="batch")
    assert not batch.allowed
    assert batch.blocked_by == "global: token_bucket(10, 1/s)"
    assert batch.retry_after == 1.0  # it needs 1 + a floor of 2, and 2 are there
    assert allowed_in_a_row(limiter, keys, 3, priority="interactive") == [True, True, False]


def test_batch_may_take_until_exactly_the_watermark_is_left(build):
    limiter = build({"user": [token_bucket(10, 1)], "global": [token_bucket(10, 1)]}, PRIORITIES)
    use_up(limiter, 7)
    keys = {"user": "u", "global": "*"}
    assert allowed_in_a_row(limiter, keys, 2, priority="batch") == [True, False]
    assert limiter.acquire(keys).allowed  # no class: no watermark either


WATERMARKED = {
    "token_bucket": token_bucket(10, 1),
    "gcra": gcra(1, 10),
    "sliding_window": sliding_window(10, 60),
    "sliding_window_counter": sliding_window_counter(10, 60),
    "fixed_window": fixed_window(10, 60),
    "concurrency": concurrency(10),
}


@pytest.mark.parametrize("spec", WATERMARKED.values(), ids=WATERMARKED.keys())
def test_every_algorithm_keeps_the_watermark_from_batch(build, spec):
    limiter = build({"user": [token_bucket(10, 1)], "global": [spec]}, PRIORITIES)
    keys = {"user": "u", "global": "*"}
    use_up(limiter, 8)
    assert not limiter.acquire(keys, priority="batch").allowed
    assert allowed_in_a_row(limiter, keys, 3, priority="interactive") == [True, True, False]


def test_the_watermark_does_not_apply_at_levels_the_class_does_not_list(build):
    limiter = build({"user": [token_bucket(10, 1)], "global": [token_bucket(1000, 1)]}, PRIORITIES)
    keys = {"user": "u", "global": "*"}
    assert allowed_in_a_row(limiter, keys, 11, priority="batch") == [True] * 10 + [False]


def test_a_class_without_levels_guards_the_global_level(build):
    limiter = build({"user": [token_bucket(10, 1)], "global": [token_bucket(10, 1)]}, {"batch": {"watermark": 0.5}})
    assert allowed_in_a_row(limiter, {"user": "u", "global": "*"}, 6, priority="batch") == [True] * 5 + [False]
    assert allowed_in_a_row(limiter, {"user": "v"}, 10, priority="batch") == [True] * 10


def test_a_class_may_guard_several_levels(build):
    limiter = build(
        {"user": [token_bucket(10, 1)], "team": [token_bucket(10, 1)]},
        {"batch": {"watermark": 0.5, "levels": ["user", "team"]}},
    )
    assert allowed_in_a_row(limiter, {"user": "u"}, 6, priority="batch") == [True] * 5 + [False]
    assert allowed_in_a_row(limiter, {"team": "t"}, 6, priority="batch") == [True] * 5 + [False]


def test_a_cost_that_could_only_fit_below_the_watermark_exceeds_the_limit_for_that_class(build):
    limiter = build({"global": [token_bucket(10, 1)]}, PRIORITIES)
    batch = limiter.acquire({"global": "*"}, cost=9, priority="batch")
    assert batch.reason == "COST_EXCEEDS_LIMIT"
    assert limiter.acquire({"global": "*"}, cost=9, priority="interactive").allowed


def test_explain_shows_the_floor_a_class_keeps(build):
    limiter = build({"user": [token_bucket(10, 1)], "global": [token_bucket(10, 1)]}, PRIORITIES)
    _, rows = limiter.explain({"user": "u", "global": "*"}, 1, "batch")
    assert [(row["level"], row["floor"]) for row in rows] == [("user", 0.0), ("global", 2.0)]


def test_an_unknown_priority_is_refused_naming_the_field_and_the_known_classes(build):
    limiter = build({"global": [token_bucket(10, 1)]}, PRIORITIES)
    with pytest.raises(InvalidRequest) as raised:
        limiter.acquire({"global": "*"}, priority="urgent")
    assert raised.value.field == "priority"
    assert "urgent" in str(raised.value)
    assert "batch" in str(raised.value) and "interactive" in str(raised.value)


def test_a_priority_on_a_limiter_without_classes_is_refused(build):
    limiter = build({"global": [token_bucket(10, 1)]})
    with pytest.raises(InvalidRequest, match="priority"):
        limiter.acquire({"global": "*"}, priority="batch")
    with pytest.raises(InvalidRequest, match="priority"):
        limiter.explain({"global": "*"}, 1, "batch")
