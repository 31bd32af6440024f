"""Calendar periods in a time zone: the bounds, in epoch seconds, of the hour, day, ISO week or
month that holds a moment, and how soon a budget runs out at the pace of its period so far.

    period_bounds("day", "Europe/Berlin", time.time())  # (start, end) of today in Berlin
    projected_exhaustion(used, limit, period_start, resets_at, time.time())

A period is what the local calendar says, not a count of seconds: a day is 23 or 25 hours on
the days the clocks change, a month its own length (29 days in a leap February), a week runs
from Monday 00:00 local to the next (ISO weeks: a week that straddles a year end is one week).
An hour is a local hour of one UTC offset: where the clocks go back, the repeated hour is two
periods, each of an hour. Every bound is a whole second (zone transitions are).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from datetime import datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

PERIODS = ("hour", "day", "week", "month", "none")
# The longest a period can be, with room to spare (a month of 31 days and a shift), and so how
# far a search for its bounds may have to look.
LONGEST = {"hour": 3 * 3600, "day": 3 * 86400, "week": 9 * 86400, "month": 33 * 86400}

Key = Callable[[datetime], Hashable]
# What tells the periods apart: two moments are in one period when their keys are equal.
KEYS: dict[str, Key] = {
    "hour": lambda t: (t.year, t.month, t.day, t.hour, t.utcoffset()),
    "day": lambda t: (t.year, t.month, t.day),
    "week": lambda t: t.isocalendar()[:2],
    "month": lambda t: (t.year, t.month),
}


def _first_local(period: str, t: datetime) -> tuple[datetime, datetime]:
    """The local wall-clock times (naive) at which `t`'s period starts and the next one does."""
    if period == "hour":
        first = datetime(t.year, t.month, t.day, t.hour)
        return first, first + timedelta(hours=1)
    day = datetime(t.year, t.month, t.day)
    if period == "day":
        return day, day + timedelta(days=1)
    if period == "week":
        monday = day - timedelta(days=t.weekday())
        return monday, monday + timedelta(days=7)
    month = datetime(t.year, t.month, 1)
    return month, datetime(t.year + t.month // 12, t.month % 12 + 1, 1)


# Every IANA time zone this machine knows (the system's zone files, or the tzdata package):
# what a quota's `timezone` may name, listed once for its parameter and the API's schema.
# Not the files that are no zone's name: the host's own zone, the template of POSIX rules, a
# placeholder (each an alias, if that, of a named zone).
TIME_ZONES: tuple[str, ...] = tuple(sorted(available_timezones() - {"localtime", "posixrules", "Factory"}))


@lru_cache(maxsize=512)
def time_zone(name: str) -> ZoneInfo:
    """The IANA time zone `name`; ValueError when there is none of that name."""
    if not isinstance(name, str) or not name:
        raise ValueError("must be an IANA time zone name, such as UTC or Europe/Berlin")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # a name that is no file (or no zone file)
        raise ValueError(f"unknown time zone {name!r} (an IANA name, such as UTC or Europe/Berlin)") from None


def period_bounds(period: str, timezone: str | ZoneInfo, now: float) -> tuple[float, float]:
    """(start, end) in epoch seconds of the `period` ("hour", "day", "week" or "month") that
    holds the moment `now` in `timezone` (an IANA name or a ZoneInfo): start <= now < end.
    "none" is the one period that never ends: (-inf, inf)."""
    if period == "none":
        return -math.inf, math.inf
    key = KEYS.get(period)
    if key is None:
        raise ValueError(f"unknown period {period!r} (known: {', '.join(PERIODS)})")
    zone = timezone if isinstance(timezone, ZoneInfo) else time_zone(timezone)
    inside = math.floor(now)  # bounds are whole seconds: the second of `now` is in the period
    label = key(datetime.fromtimestamp(inside, zone))

    def key_at(second: int) -> Hashable:
        return key(datetime.fromtimestamp(second, zone))

    first, after = _first_local(period, datetime.fromtimestamp(inside, zone))
    start = _start(first, zone, key_at, label, inside, LONGEST[period])
    end = _end(after, zone, key_at, label, inside, LONGEST[period])
    return float(start), float(end)


def _candidates(local: datetime, zone: ZoneInfo) -> list[int]:
    """The instants a local wall-clock time may stand for: one, or two where the clocks went
    back (fold), or the two sides of a gap where they went forward."""
    return sorted({int(local.replace(tzinfo=zone, fold=fold).timestamp()) for fold in (0, 1)})


def _start(first: datetime, zone: ZoneInfo, key_at: Callable, label: Hashable, inside: int, longest: int) -> int:
    for second in _candidates(first, zone):
        if second <= inside and key_at(second) == label and key_at(second - 1) != label:
            return second
    # The period starts at a zone transition, not at its wall-clock start (a gap, or a change
    # of offset within the hour): the first second with its key, found by bisection.
    low = inside - longest
    while key_at(low) == label:
        low -= longest
    high = inside
    while high - low > 1:  # key_at(low) != label, key_at(high) == label
        middle = (low + high) // 2
        if key_at(middle) == label:
            high = middle
        else:
            low = middle
    return high


def _end(after: datetime, zone: ZoneInfo, key_at: Callable, label: Hashable, inside: int, longest: int) -> int:
    for second in _candidates(after, zone):
        if second > inside and key_at(second) != label and key_at(second - 1) == label:
            return second
    high = inside + longest
    while key_at(high) == label:
        high += longest
    low = inside
    while high - low > 1:  # key_at(low) == label, key_at(high) != label
        middle = (low + high) // 2
        if key_at(middle) == label:
            low = middle
        else:
            high = middle
    return high


def projected_exhaustion(
    used: float, limit: float, period_start: float | None, resets_at: float | None, now: float
) -> float | None:
    """When a budget of `limit` runs out if it goes on being used at its pace so far this
    period (`used` since `period_start`), in epoch seconds. `now` when it already has; None
    when nothing was used yet, or that pace does not run it out before `resets_at`. Credits
    (`period: none`, no start or reset) have no period to take a pace from: None."""
    if period_start is None or resets_at is None or used <= 0 or now <= period_start:
        return None
    if used >= limit:
        return now
    at = period_start + (now - period_start) * limit / used
    return at if at < resets_at else None


__all__ = ["PERIODS", "period_bounds", "projected_exhaustion", "time_zone"]
