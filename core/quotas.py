"""The quota: a budget per calendar period (hour, day, ISO week, month) in a time zone of its own,
or a balance of credits that only a top-up refills (`period: none`).

    {"type": "quota", "limit": 1_000_000, "period": "month", "timezone": "Europe/Berlin"}
    {"type": "quota", "limit": 800_000, "period": "month", "mode": "soft", "demote_to": "batch"}
    {"type": "quota", "limit": 500, "period": "none"}  # credits: HierarchicalLimiter.top_up

Hard (the default): a request that would take `used + cost` past `limit` is denied until the
next period starts (`retry_after`), or, for credits, until a top-up (never by itself). Soft: the
request goes, its cost counted past the limit, and the decision names the quota in
`over_quota`; with `demote_to` it is decided under that priority class's watermarks.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from typing import Any

from .errors import ConfigError
from .params import Param, format_number
from .periods import PERIODS, TIME_ZONES, period_bounds, time_zone
from .rules import EPSILON, Rule, register
from .twins import LUA_DIR, RedisTwin

QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
MODES = ("hard", "soft")
# How long a period's count outlives the period: a worker whose clock is behind Redis's by
# less than this still finds its period's count, rather than a key that expired.
PERIOD_SLACK = 60.0
# A period that contains nothing: the first moment asked about computes the real one.
NO_PERIOD = (math.inf, -math.inf)
# The one period of credits: the state's start is 0, and it never ends.
CREDITS = (0.0, math.inf)


def _encode(rule: Quota, state: Any) -> str:
    # "start used": the start of the period counted in (0 for credits) and its cost so far.
    return f"{state[2]!r} {state[3]!r}"


def _decode(rule: Quota, raw: bytes) -> tuple:
    start, used = map(float, raw.split())
    return 0.0, 0.0, start, used


@register("quota")
class Quota(Rule):
    """A budget of `limit` per calendar period in `timezone`, or credits (`period: none`).

    State: (idle_at, room, period start, used): the start (epoch seconds, 0 for credits) of
    the period whose cost `used` counts. A state of an earlier period is as good as none; one
    of a later period (written by a worker whose clock is ahead) is counted in as it is, so
    that two clocks astride a boundary do not reset each other's count. A period's state
    goes idle at its end (plus PERIOD_SLACK); a balance of credits never goes idle.

    The period is computed where zoneinfo is (core/periods.py), on epoch seconds: `now`, or
    the wall clock a limiter hands it (`on_wall_clock`) when its own clock is something else.
    Its bounds are cached on the rule: a decision pays a comparison, and zoneinfo is asked
    again only once a period is over.
    """

    params = (
        Param(
            "limit",
            help="Cost units per period; for credits, the balance to start from.",
            minimum=0,
            exclusive_minimum=True,
        ),
        Param(
            "period",
            kind="choice",
            choices=PERIODS,
            help="hour, day, week (ISO, from Monday), month, or none: credits, refilled only by a top-up.",
        ),
        Param(
            "timezone",
            kind="choice",
            choices=TIME_ZONES,
            default="UTC",
            refusal="unknown time zone {value!r} (an IANA name, such as UTC or Europe/Berlin)",
            help="The IANA time zone the periods follow (Europe/Berlin).",
        ),
        Param(
            "mode",
            kind="choice",
            choices=MODES,
            default="hard",
            help="hard denies past the limit; soft lets the request go and names the quota in over_quota.",
        ),
        Param(
            "demote_to",
            kind="string",
            default=None,
            names="priority",
            help="Soft only: the priority class whose watermarks decide a request past the limit.",
        ),
    )
    scaled_params = ("limit",)
    redis_twin = RedisTwin(
        LUA_DIR / "quota.lua",
        ("capacity", "soft", "credits"),
        _encode,
        _decode,
        per_call=lambda rule, now: rule.period_at(now)[:2] if not rule.credits else (0.0, 0.0),
    )
    limit: float  # the parameters, set from `params`
    period: str
    timezone: str
    mode: str
    # The wall clock a limiter hands it when `now` is not epoch seconds (see on_wall_clock).
    wall: Callable[[], float] | None = None

    def setup(self) -> None:
        self.capacity = float(self.limit)
        try:
            self.zone = time_zone(self.timezone)
        except ValueError as error:
            raise ConfigError(str(error), "timezone") from None
        self.soft = self.mode == "soft"
        self.credits = self.period == "none"
        # Taken rather than refused, so that every rule the API's schema describes is one the
        # engine builds (a JSON schema cannot state one parameter's bounds by another's): a
        # hard quota denies past its limit, so it has no one to demote (demote_to is inert
        # there); a soft quota never denies, so `shadow` adds nothing to it.
        if not self.soft:
            self.demote_to = None
        if self.soft:
            self.shadow = False
        if self.label is None:
            self.label = QUOTA_EXCEEDED
        self._bounds = NO_PERIOD

    def on_wall_clock(self, clock: Callable[[], float]) -> Quota:
        bound = copy.copy(self)
        bound.wall, bound._bounds = clock, NO_PERIOD
        return bound

    def scaled(self, fraction: float) -> Rule:
        scaled = super().scaled(fraction)
        return scaled.on_wall_clock(self.wall) if self.wall is not None else scaled

    def period_at(self, now: float | None) -> tuple[float, float, float]:
        """(start, end, wall): the period that holds the wall-clock time of `now`, and that
        time. Credits: (0, inf, wall). `now` None (the store keeps the time) reads this
        process's clock."""
        wall = self.wall() if self.wall is not None else time.time() if now is None else now
        start, end = self._current(wall)
        return start, end, wall

    def _current(self, wall: float) -> tuple[float, float]:
        """The bounds of the period that holds `wall`: the cached ones, or, once `wall` has
        left them, the next from zoneinfo (cached in turn)."""
        bounds = self._bounds
        if not bounds[0] <= wall < bounds[1]:
            bounds = self._bounds = CREDITS if self.credits else period_bounds(self.period, self.zone, wall)
        return bounds

    @staticmethod
    def _counted(state: Any, start: float) -> tuple[float, float]:
        """(the period counted in, its cost so far): the state's, unless it is of an earlier
        period than the one starting at `start`, which starts from nothing."""
        if state is None or state[2] < start:
            return start, 0.0
        return state[2], state[3]

    def _state(self, now: float, end: float, wall: float, start: float, used: float) -> tuple:
        # idle_at on the store's clock: `now` plus what is left of the period by the wall's
        # (never, for credits, whose period never ends).
        return now + (end - wall) + PERIOD_SLACK, self.capacity - used, start, used

    def max_cost(self, floor: float) -> float:
        # A soft quota takes any cost; credits can be topped up past any cost.
        return math.inf if self.soft or self.credits else super().max_cost(floor)

    def wait(self, state: Any, now: float, cost: float, floor: float) -> float:
        if self.soft:
            return 0.0
        start, end, wall = self.period_at(now)
        used = self._counted(state, start)[1]
        if used + cost + floor - self.capacity <= EPSILON:
            return 0.0
        if self.credits or cost + floor > self.capacity:
            return math.inf  # credits: only a top-up helps
        return end - wall  # the next period

    def attempt(self, state: Any, now: float, cost: float, floor: float) -> Any:
        # The hot path: period_at, _counted and _state written out, the same arithmetic.
        wall = now if self.wall is None else self.wall()
        bounds = self._bounds
        if not bounds[0] <= wall < bounds[1]:
            bounds = self._current(wall)
        start = bounds[0]
        if state is None or state[2] < start:
            used = cost
        else:
            start, used = state[2], state[3] + cost
        if used + floor - self.capacity > EPSILON and not self.soft:
            return self.wait(state, now, cost, floor) or EPSILON
        return now + (bounds[1] - wall) + PERIOD_SLACK, self.capacity - used, start, used

    def adjust(self, state: Any, now: float, delta: float, taken_at: float) -> Any:
        # A charge goes into the current period, past the limit if need be (the work is done);
        # a refund comes off it only if the estimate was taken in it (a later one never
        # counted it). Credits take both: a top-up is a refund taken now.
        start, end, wall = self.period_at(now)
        counted, used = self._counted(state, start)
        if delta > 0 or self.credits:
            used += delta
        elif taken_at + (wall - now) >= counted:
            used = max(0.0, used + delta)
        if used == 0.0:
            return None
        return self._state(now, end, wall, counted, used)

    def remaining(self, state: Any, now: float) -> float:
        return max(0.0, self.balance(state, now))

    def balance(self, state: Any, now: float) -> float:
        return self.capacity - self._counted(state, self.period_at(now)[0])[1]

    def inspect(self, state: Any, now: float) -> dict:
        """`remaining` is limit - used: below zero after an overspend (a settled charge, a
        soft quota), above the limit for credits topped up. Times are epoch seconds; None for
        credits, whose balance never resets."""
        start, end, _ = self.period_at(now)
        counted, used = self._counted(state, start)
        return {
            "used": used,
            "limit": self.capacity,
            "remaining": self.capacity - used,
            "period_start": None if self.credits else counted,
            "resets_at": None if self.credits else end,
            "mode": self.mode,
            "period": self.period,
            "timezone": self.timezone,
        }

    def describe(self) -> str:
        soft = ", soft" if self.soft else ""
        if self.credits:
            return f"quota({format_number(self.capacity)} credits{soft})"
        zone = "" if self.timezone == "UTC" else f" {self.timezone}"
        return f"quota({format_number(self.capacity)}/{self.period}{zone}{soft})"

    one_state = (
        "quotas of the same period, time zone and mode that count the same are one budget, "
        "whatever their limits, labels and demote_to"
    )

    def _rule_id(self) -> str:
        # The state is named by what it counts, not by the limit it is held to: an operator
        # who raises a monthly budget mid-month keeps what was used (a new name would start
        # the month again at 0), and changing demote_to keeps it too. The mode is part of it,
        # so that a hard budget and a soft one of the same period (a warning below the cap)
        # count apart; two of the same period, zone and mode at one level are one budget, and
        # the policy refuses the second as a repeat. A balance of credits is named by nothing
        # else: it outlives a change of its starting limit (the new limit moves every balance
        # by the difference), and a top-up is never lost to an edit.
        # (It runs before setup(): it reads the parameters alone.)
        if self.period == "none":
            parts = ["quota", "credits"]
        else:
            parts = ["quota", self.period, self.timezone, self.mode]
        return ":".join(parts + ["requests"] if self.counts_requests else parts)
