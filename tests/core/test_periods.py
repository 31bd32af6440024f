"""Calendar periods (core/periods.py): the bounds of the hour, day, ISO week or month that holds a
moment, in the period's own time zone, across the days the clocks change, month ends, leap
years and year ends; and the projected exhaustion of a budget at its pace so far."""

import math
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from core.periods import period_bounds, projected_exhaustion, time_zone

NEW_YORK, BERLIN, SANTIAGO = "America/New_York", "Europe/Berlin", "America/Santiago"


def at(text: str, zone: str) -> float:
    """The epoch seconds of a local wall-clock time in `zone` (the first, where it repeats)."""
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone)).timestamp()


def local(seconds: float, zone: str) -> str:
    return datetime.fromtimestamp(seconds, ZoneInfo(zone)).isoformat()


def bounds(period: str, zone: str, moment: str) -> tuple[str, str, float]:
    """The period that holds `moment` (an ISO time with its offset), as local times, and its hours."""
    start, end = period_bounds(period, zone, datetime.fromisoformat(moment).timestamp())
    return local(start, zone), local(end, zone), (end - start) / 3600


@pytest.mark.parametrize(
    ("zone", "moment", "expected"),
    [
        # Spring forward: 23 hours. Fall back: 25.
        (NEW_YORK, "2024-03-10T12:00:00-04:00", ("2024-03-10T00:00:00-05:00", "2024-03-11T00:00:00-04:00", 23)),
        (NEW_YORK, "2024-11-03T00:30:00-04:00", ("2024-11-03T00:00:00-04:00", "2024-11-04T00:00:00-05:00", 25)),
        (BERLIN, "2024-03-31T02:59:59+02:00", ("2024-03-31T00:00:00+01:00", "2024-04-01T00:00:00+02:00", 23)),
        (BERLIN, "2024-10-27T23:59:59+01:00", ("2024-10-27T00:00:00+02:00", "2024-10-28T00:00:00+01:00", 25)),
        # Half an hour east of a whole hour, and a day that starts at 01:00 (midnight skipped).
        ("Asia/Kolkata", "2024-06-01T00:00:00+05:30", ("2024-06-01T00:00:00+05:30", "2024-06-02T00:00:00+05:30", 24)),
        (SANTIAGO, "2024-09-08T12:00:00-03:00", ("2024-09-08T01:00:00-03:00", "2024-09-09T00:00:00-03:00", 23)),
        # A day the calendar skipped: 29 December 2011 in Samoa ends at 31 December.
        ("Pacific/Apia", "2011-12-29T23:59:59-10:00", ("2011-12-29T00:00:00-10:00", "2011-12-31T00:00:00+14:00", 24)),
    ],
)
def test_a_day_is_the_local_calendar_day_whatever_its_length(zone, moment, expected):
    assert bounds("day", zone, moment) == expected


def test_an_hour_where_the_clocks_go_back_is_two_periods_of_an_hour():
    first = bounds("hour", "America/New_York", "2024-11-03T01:59:59-04:00")
    second = bounds("hour", "America/New_York", "2024-11-03T01:00:00-05:00")
    assert first == ("2024-11-03T01:00:00-04:00", "2024-11-03T01:00:00-05:00", 1)
    assert second == ("2024-11-03T01:00:00-05:00", "2024-11-03T02:00:00-05:00", 1)


def test_an_hour_follows_a_half_hour_offset_and_a_half_hour_shift():
    assert bounds("hour", "Asia/Kolkata", "2024-06-01T10:45:00+05:30")[:2] == (
        "2024-06-01T10:00:00+05:30",
        "2024-06-01T11:00:00+05:30",
    )
    # Lord Howe Island moves its clocks by 30 minutes: 02:00 becomes 02:30, and back.
    assert bounds("hour", "Australia/Lord_Howe", "2024-10-06T02:40:00+11:00") == (
        "2024-10-06T02:30:00+11:00",
        "2024-10-06T03:00:00+11:00",
        0.5,
    )
    assert bounds("hour", "Australia/Lord_Howe", "2024-04-07T01:40:00+10:30") == (
        "2024-04-07T01:30:00+10:30",
        "2024-04-07T02:00:00+10:30",
        0.5,
    )


@pytest.mark.parametrize(
    ("moment", "expected"),
    [
        # ISO week 1 of 2025 starts on Monday 30 December 2024.
        ("2025-01-01T12:00:00+01:00", ("2024-12-30T00:00:00+01:00", "2025-01-06T00:00:00+01:00")),
        ("2024-12-29T23:59:59+01:00", ("2024-12-23T00:00:00+01:00", "2024-12-30T00:00:00+01:00")),
        # ISO week 53 of 2020 runs into 2021.
        ("2021-01-03T12:00:00+01:00", ("2020-12-28T00:00:00+01:00", "2021-01-04T00:00:00+01:00")),
        # The week the clocks go forward is 167 hours.
        ("2024-03-31T12:00:00+02:00", ("2024-03-25T00:00:00+01:00", "2024-04-01T00:00:00+02:00")),
    ],
)
def test_a_week_runs_from_monday_to_monday_across_a_year_end(moment, expected):
    start, end, _ = bounds("week", "Europe/Berlin", moment)
    assert (start, end) == expected


@pytest.mark.parametrize(
    ("zone", "moment", "expected", "days"),
    [
        ("UTC", "2024-01-31T23:59:59+00:00", ("2024-01-01T00:00:00+00:00", "2024-02-01T00:00:00+00:00"), 31),
        ("UTC", "2024-02-29T12:00:00+00:00", ("2024-02-01T00:00:00+00:00", "2024-03-01T00:00:00+00:00"), 29),
        ("UTC", "2023-02-28T12:00:00+00:00", ("2023-02-01T00:00:00+00:00", "2023-03-01T00:00:00+00:00"), 28),
        ("UTC", "2024-12-31T23:59:59+00:00", ("2024-12-01T00:00:00+00:00", "2025-01-01T00:00:00+00:00"), 31),
        # March in Berlin loses an hour; October gains one.
        (BERLIN, "2024-03-01T00:00:00+01:00", ("2024-03-01T00:00:00+01:00", "2024-04-01T00:00:00+02:00"), None),
        (NEW_YORK, "2024-11-30T23:00:00-05:00", ("2024-11-01T00:00:00-04:00", "2024-12-01T00:00:00-05:00"), None),
    ],
)
def test_a_month_has_its_own_length(zone, moment, expected, days):
    start, end, hours = bounds("month", zone, moment)
    assert (start, end) == expected
    if days is not None:
        assert hours == days * 24


def test_the_same_moment_is_in_different_days_in_different_zones():
    moment = at("2024-06-01T23:30:00", "UTC")
    assert local(period_bounds("day", "UTC", moment)[0], "UTC") == "2024-06-01T00:00:00+00:00"
    assert local(period_bounds("day", "Asia/Kolkata", moment)[0], "Asia/Kolkata") == "2024-06-02T00:00:00+05:30"
    assert local(period_bounds("day", "America/New_York", moment)[0], "America/New_York") == "2024-06-01T00:00:00-04:00"


@pytest.mark.parametrize("period", ["hour", "day", "week", "month"])
@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"])
def test_periods_tile_time_start_holds_and_end_does_not(period, zone):
    # A year of consecutive periods, from 2024-01-01: each starts where the last ended.
    moment = at("2024-01-01T00:00:00", zone)
    finish = moment + 366 * 86400
    seen = 0
    while moment < finish:
        start, end = period_bounds(period, zone, moment)
        assert start <= moment < end and start == int(start) and end == int(end)
        assert period_bounds(period, zone, end - 0.5) == (start, end)
        assert period_bounds(period, zone, end)[0] == end
        moment, seen = end, seen + 1
    assert seen >= {"hour": 8784, "day": 366, "week": 52, "month": 12}[period]


def test_credits_have_one_period_that_never_ends():
    assert period_bounds("none", "UTC", 1e9) == (-math.inf, math.inf)


def test_an_unknown_time_zone_or_period_is_refused():
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        time_zone("Mars/Olympus")
    with pytest.raises(ValueError, match="unknown time zone"):
        time_zone("../etc/passwd")
    with pytest.raises(ValueError, match="unknown period 'fortnight'"):
        period_bounds("fortnight", "UTC", 0.0)


class TestProjectedExhaustion:
    def test_the_pace_so_far_extrapolated(self):
        # 250 of 1000 used in the first 6 hours of a day: all of it after 24 hours.
        assert projected_exhaustion(250, 1000, 0.0, 86400.0 * 2, 6 * 3600.0) == 24 * 3600.0

    def test_none_when_the_pace_does_not_run_it_out_before_the_reset(self):
        assert projected_exhaustion(250, 1000, 0.0, 86400.0, 6 * 3600.0) is None  # at exactly the reset

    def test_none_when_nothing_was_used_or_no_time_passed(self):
        assert projected_exhaustion(0, 1000, 0.0, 86400.0, 3600.0) is None
        assert projected_exhaustion(10, 1000, 3600.0, 86400.0, 3600.0) is None

    def test_now_when_it_is_already_exhausted(self):
        assert projected_exhaustion(1200, 1000, 0.0, 86400.0, 3600.0) == 3600.0

    def test_none_for_credits(self):
        assert projected_exhaustion(10, 1000, None, None, 3600.0) is None
