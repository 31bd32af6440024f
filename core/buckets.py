"""Bucket-shaped rules: the token bucket and GCRA. Both allow a burst, then a steady rate."""

from __future__ import annotations

import math

from .params import Param, _number
from .rules import EPSILON, MAX_IDLE_SECONDS, Rule, register


@register("token_bucket")
class TokenBucket(Rule):
    """Holds up to `capacity` tokens and refills lazily at `per_second`.

    State: (tokens, updated). Two numbers per key, whatever the traffic.
    """

    params = (
        Param("capacity", help="Most tokens the bucket holds: the largest burst.",
              minimum=0, exclusive_minimum=True),
        Param("per_second", help="Tokens added back each second. 0 means it never refills.",
              minimum=0),
    )

    def setup(self) -> None:
        self.capacity = float(self.capacity)
        self.rate = float(self.per_second)

    def describe(self) -> str:
        return f"token_bucket({_number(self.capacity)}, {_number(self.rate)}/s)"

    def _tokens(self, state, now: float) -> float:
        if state is None:
            return self.capacity
        tokens, updated = state
        if now > updated:
            tokens += (now - updated) * self.rate
            if tokens > self.capacity:
                return self.capacity
        return tokens

    def wait(self, state, now, cost, floor):
        missing = cost + floor - self._tokens(state, now)
        if missing <= EPSILON:
            return 0.0
        if cost + floor > self.capacity or not self.rate:
            return math.inf
        return missing / self.rate

    def take(self, state, now, cost, lease):
        tokens = self._tokens(state, now) - cost
        # A clock that steps back must not refill the same interval twice.
        updated = now if state is None or now > state[1] else state[1]
        if self.rate:
            return (tokens, updated), updated + (self.capacity - tokens) / self.rate
        return (tokens, updated), updated + MAX_IDLE_SECONDS

    def remaining(self, state, now):
        return max(0.0, self._tokens(state, now))

    def inspect(self, state, now):
        tokens = self._tokens(state, now)
        full_in = (self.capacity - tokens) / self.rate if self.rate else (
            0.0 if tokens >= self.capacity else math.inf)
        return {"tokens": max(0.0, tokens), "capacity": self.capacity,
                "remaining": max(0.0, tokens), "full_in": full_in}


@register("gcra")
class GCRA(Rule):
    """Generic cell rate algorithm: `rate` per second with bursts of `burst`.

    State: one number, the theoretical arrival time (TAT) of the next request. It admits
    exactly what a token bucket of capacity `burst` refilling at `rate` admits.
    """

    params = (
        Param("rate", help="Requests (or cost units) per second, sustained.",
              minimum=0, exclusive_minimum=True),
        Param("burst", help="How much may go at once after a quiet spell.",
              minimum=0, exclusive_minimum=True),
    )

    def setup(self) -> None:
        self.capacity = float(self.burst)
        self.interval = 1.0 / self.rate

    def describe(self) -> str:
        return f"gcra({_number(self.rate)}/s, burst {_number(self.burst)})"

    def _used(self, state, now: float) -> float:
        """Cost units still outstanding: how far the TAT runs ahead of now, times the rate."""
        return (state - now) * self.rate if state is not None and state > now else 0.0

    def wait(self, state, now, cost, floor):
        over = self._used(state, now) + cost + floor - self.capacity
        if over <= EPSILON:
            return 0.0
        if cost + floor > self.capacity:
            return math.inf
        return over * self.interval

    def take(self, state, now, cost, lease):
        start = state if state is not None and state > now else now
        tat = start + cost * self.interval
        return tat, tat

    def remaining(self, state, now):
        return max(0.0, self.capacity - self._used(state, now))

    def inspect(self, state, now):
        used = self._used(state, now)
        return {"tokens": max(0.0, self.capacity - used), "capacity": self.capacity,
                "remaining": max(0.0, self.capacity - used), "full_in": used * self.interval}
