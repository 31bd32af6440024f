"""Bucket-shaped rules: the token bucket and GCRA. Both allow a burst, then a steady rate."""

from __future__ import annotations

import math
from typing import Any

from .params import Param, format_number
from .rules import EPSILON, MAX_IDLE_SECONDS, Rule, register
from .twins import LUA_DIR, RedisTwin

# A bucket that would hold the cost within TIME_SLACK counts as holding it now. full_at keeps
# whole microseconds, rounded to the nearest at every take, and times are doubles of epoch
# seconds (Redis TIME), exact to about 0.25 us: when a burst's takes all round the same way
# (a cost / rate of 0.6666667 s, say) the roundings add up, and without the slack the last
# token of a burst at epoch times was denied for a wait of a few microseconds in about a third
# of bursts (which Retry-After then rounds up to a whole second). 3 us removes it for bursts of
# up to ~6 rounded-up takes and more when roundings alternate; it admits at most rate x 3 us
# tokens early, far below what a client can observe (a loopback round trip is ~100 us).
TIME_SLACK = 3e-6


def slack_of(rate: float) -> float:
    return EPSILON + rate * TIME_SLACK


def _encode_bucket(rule: TokenBucket, state: Any) -> int | str:
    # The microsecond at which it is full again, as an integer (Redis's smallest value); for a
    # bucket that never refills, the tokens spent.
    return round(state[0] * 1e6) if rule.rate else repr(float(state[2]))


def _decode_bucket(rule: TokenBucket, raw: bytes) -> tuple:
    value = float(raw)
    return (value * 1e-6, 0.0) if rule.rate else (0.0, 0.0, value)


# Both bucket-shaped rules run the same Lua (GCRA is a token bucket; see GCRA).
BUCKET_TWIN = RedisTwin(
    LUA_DIR / "token_bucket.lua", ("capacity", "rate"), _encode_bucket, _decode_bucket, shareable=True
)


@register("token_bucket")
class TokenBucket(Rule):
    """Holds up to `capacity` tokens and refills lazily at `per_second`.

    State: (full_at, remaining), where full_at, also the time the key goes idle, is when
    the bucket is full again, on a grid of whole microseconds: tokens = capacity -
    (full_at - now) x rate. One integer is all a store must keep (on Redis, an
    integer-encoded string, the smallest value there is). Keeping time to the microsecond
    means a bucket refilling faster than 1,000,000 tokens a second rounds by up to half a
    token a take; we accept it for the memory. A bucket that never refills keeps the tokens spent instead, for 24 h.
    """

    params = (
        Param("capacity", help="Most tokens the bucket holds: the largest burst.", minimum=0, exclusive_minimum=True),
        Param("per_second", help="Tokens added back each second. 0 means it never refills.", minimum=0),
    )

    scaled_params = ("capacity", "per_second")
    redis_twin = BUCKET_TWIN
    per_second: float  # a parameter, set from `params`
    rate: float  # tokens per second, as a float
    slack: float

    def setup(self) -> None:
        self.capacity = float(self.capacity)
        self.rate = float(self.per_second)
        self.slack = slack_of(self.rate)

    def describe(self) -> str:
        return f"token_bucket({format_number(self.capacity)}, {format_number(self.rate)}/s)"

    def _tokens(self, state: Any, now: float) -> float:
        if state is None:
            return self.capacity
        if not self.rate:
            return self.capacity - state[2]
        ahead = state[0] - now
        return self.capacity - ahead * self.rate if ahead > 0 else self.capacity

    def wait(self, state: Any, now: float, cost: float, floor: float) -> float:
        missing = cost + floor - self._tokens(state, now)
        if missing <= self.slack:
            return 0.0
        if cost + floor > self.capacity or not self.rate:
            return math.inf
        return missing / self.rate

    def attempt(self, state: Any, now: float, cost: float, floor: float) -> Any:
        # The hot path: one call does phase 1's arithmetic and phase 2's new state.
        rate = self.rate
        if not rate:
            return self._attempt_without_refill(state, now, cost, floor)
        start = state[0] if state is not None and state[0] > now else now
        tokens = self.capacity - (start - now) * rate  # the same double _tokens() finds
        left = tokens - cost
        if left - floor < -self.slack:  # denied: wait()'s arithmetic, written out
            missing = cost + floor - tokens
            if missing <= self.slack:  # the other rounding of the same sum: still a denial
                return EPSILON
            return math.inf if cost + floor > self.capacity else missing / rate
        # full_at on the microsecond grid: the one number the Redis store keeps, as an
        # integer, and from which it computes this same double.
        return ((start + cost / rate) * 1e6 + 0.5) // 1 * 1e-6, left

    def _attempt_without_refill(self, state: Any, now: float, cost: float, floor: float) -> Any:
        spent = (state[2] if state is not None else 0.0) + cost
        left = self.capacity - spent
        if left - floor < -EPSILON:
            return math.inf
        return now + MAX_IDLE_SECONDS, left, spent

    def adjust(self, state: Any, now: float, delta: float, taken_at: float) -> Any:
        # A charge takes as `attempt` takes, with no floor: the tokens may go below zero,
        # and the bucket is full again that much later. A refund moves full_at back.
        rate = self.rate
        if not rate:
            spent = (state[2] if state is not None else 0.0) + delta
            return (now + MAX_IDLE_SECONDS, self.capacity - spent, spent) if spent > 0 else None
        if delta > 0:
            full_at = (state[0] if state is not None and state[0] > now else now) + delta / rate
        elif state is None or state[0] + delta / rate <= now:
            return None  # full again: a refund never raises a bucket above its capacity
        else:
            full_at = state[0] + delta / rate
        full_at = (full_at * 1e6 + 0.5) // 1 * 1e-6  # the microsecond grid, as in attempt
        return full_at, self.capacity - (full_at - now) * rate

    def remaining(self, state: Any, now: float) -> float:
        return max(0.0, self._tokens(state, now))

    def inspect(self, state: Any, now: float) -> dict:
        """`tokens` is the real balance: below zero while a settled charge is in debt, which
        `debt_clears_in` seconds pay off (0 when not in debt; inf for a bucket that never
        refills); `remaining`, what a request may take now, is never below zero."""
        return bucket_state(self._tokens(state, now), self.capacity, self.rate, self.slack)


def bucket_state(tokens: float, capacity: float, rate: float, slack: float = EPSILON) -> dict:
    """What operators see of a bucket with `tokens` in it (see TokenBucket.inspect)."""
    in_debt = tokens < -slack  # within the slack a bucket is as good as empty, as in wait()
    if rate:
        full_in, debt_clears_in = (capacity - tokens) / rate, -tokens / rate if in_debt else 0.0
    else:
        full_in, debt_clears_in = 0.0 if tokens >= capacity else math.inf, math.inf if in_debt else 0.0
    return {
        "tokens": tokens,
        "capacity": capacity,
        "remaining": max(0.0, tokens),
        "full_in": full_in,
        "debt_clears_in": debt_clears_in,
    }


@register("gcra")
class GCRA(TokenBucket):
    """Generic cell rate algorithm: `rate` per second with bursts of `burst`.

    Its one timestamp of state, the theoretical arrival time, is the token bucket's
    full_at: GCRA admits exactly what a token bucket of capacity `burst` refilling at
    `rate` admits, so it shares the token bucket's arithmetic (and its Lua).
    """

    params = (
        Param("rate", help="Requests (or cost units) per second, sustained.", minimum=0, exclusive_minimum=True),
        Param("burst", help="How much may go at once after a quiet spell.", minimum=0, exclusive_minimum=True),
    )

    scaled_params = ("rate", "burst")
    redis_twin = BUCKET_TWIN
    burst: float  # a parameter, set from `params`

    def setup(self) -> None:
        self.capacity = float(self.burst)
        self.rate = float(self.rate)
        self.slack = slack_of(self.rate)

    def describe(self) -> str:
        return f"gcra({format_number(self.rate)}/s, burst {format_number(self.burst)})"
