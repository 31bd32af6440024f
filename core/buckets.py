"""Bucket-shaped rules: the token bucket and GCRA. Both allow a burst, then a steady rate."""

from __future__ import annotations

import math

from .params import Param, _number
from .rules import EPSILON, MAX_IDLE_SECONDS, Rule, register


@register("token_bucket")
class TokenBucket(Rule):
    """Holds up to `capacity` tokens and refills lazily at `per_second`.

    State: (idle_at, tokens, updated); the tokens are also the room left.
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
        # Seconds per token, to find when the bucket is full again; a bucket that never
        # refills is kept for MAX_IDLE_SECONDS after its last take.
        self.refill_time = 1.0 / self.rate if self.rate else 0.0

    def describe(self) -> str:
        return f"token_bucket({_number(self.capacity)}, {_number(self.rate)}/s)"

    def _tokens(self, state, now: float) -> float:
        if state is None:
            return self.capacity
        _, tokens, updated = state
        if now > updated:
            tokens += (now - updated) * self.rate
            if tokens > self.capacity:
                return self.capacity
        return tokens

    def wait(self, state, now, cost, floor):
        if state is None:
            tokens = self.capacity
        else:  # _tokens(), written out: this runs on every denial
            _, tokens, updated = state
            if now > updated:
                tokens += (now - updated) * self.rate
                if tokens > self.capacity:
                    tokens = self.capacity
        missing = cost + floor - tokens
        if missing <= EPSILON:
            return 0.0
        if cost + floor > self.capacity or not self.rate:
            return math.inf
        return missing / self.rate

    def attempt(self, state, now, cost, floor):
        # The hot path: refill once, and hand back the state to store if all rules agree.
        capacity = self.capacity
        if state is None:
            tokens, updated = capacity, now
        else:
            _, tokens, updated = state
            if now > updated:  # a clock that steps back must not refill an interval twice
                tokens += (now - updated) * self.rate
                if tokens > capacity:
                    tokens = capacity
                updated = now
        left = tokens - cost
        if left - floor < -EPSILON:  # denied: the wait, as wait() would find it
            if cost + floor > capacity or not self.rate:
                return math.inf
            return (floor - left) * self.refill_time or EPSILON
        if self.refill_time:
            return updated + (capacity - left) * self.refill_time, left, updated
        return updated + MAX_IDLE_SECONDS, left, updated

    def remaining(self, state, now):
        if state is None:
            return self.capacity
        _, tokens, updated = state  # _tokens(), written out: this runs on every denial
        if now > updated:
            tokens += (now - updated) * self.rate
        return self.capacity if tokens > self.capacity else max(0.0, tokens)

    def inspect(self, state, now):
        tokens = self._tokens(state, now)
        if self.rate:
            full_in = (self.capacity - tokens) / self.rate
        else:
            full_in = 0.0 if tokens >= self.capacity else math.inf
        return {"tokens": max(0.0, tokens), "capacity": self.capacity,
                "remaining": max(0.0, tokens), "full_in": full_in}


@register("gcra")
class GCRA(Rule):
    """Generic cell rate algorithm: `rate` per second with bursts of `burst`.

    State: (tat, room), where tat, the theoretical arrival time, is also when the key goes
    idle. It admits exactly what a token bucket of capacity `burst` refilling at `rate`
    admits, with one timestamp of state.
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
        """Cost still outstanding: how far the TAT runs ahead of now, times the rate."""
        return (state[0] - now) * self.rate if state is not None and state[0] > now else 0.0

    def wait(self, state, now, cost, floor):
        over = self._used(state, now) + cost + floor - self.capacity
        if over <= EPSILON:
            return 0.0
        if cost + floor > self.capacity:
            return math.inf
        return over * self.interval

    def attempt(self, state, now, cost, floor):
        start = state[0] if state is not None and state[0] > now else now
        tat = start + cost * self.interval
        left = self.capacity - (tat - now) * self.rate
        if left - floor < -EPSILON:
            return self.wait(state, now, cost, floor) or EPSILON
        return tat, left

    def remaining(self, state, now):
        return max(0.0, self.capacity - self._used(state, now))

    def inspect(self, state, now):
        used = self._used(state, now)
        return {"tokens": max(0.0, self.capacity - used), "capacity": self.capacity,
                "remaining": max(0.0, self.capacity - used), "full_in": used * self.interval}
