"""Small helpers shared by the engine's tests."""

import math

from core import Param, Rule, register

# One tick before an edge: far below every window and rate used in these tests, far above
# the engine's slacks (1e-9 of a unit; a token bucket's 3 us of refill, core.buckets.TIME_SLACK),
# so "one tick early" is always a real denial.
TICK = 1e-5


def token_bucket(capacity, per_second, **extra):
    return {"type": "token_bucket", "capacity": capacity, "per_second": per_second, **extra}


def gcra(rate, burst, **extra):
    return {"type": "gcra", "rate": rate, "burst": burst, **extra}


def sliding_window(limit, window, **extra):
    return {"type": "sliding_window", "limit": limit, "window": window, **extra}


def sliding_window_counter(limit, window, **extra):
    return {"type": "sliding_window_counter", "limit": limit, "window": window, **extra}


def fixed_window(limit, window, **extra):
    return {"type": "fixed_window", "limit": limit, "window": window, **extra}


def concurrency(limit, lease=60, **extra):
    return {"type": "concurrency", "limit": limit, "lease": lease, **extra}


def state_of(limiter, level, key, index=0):
    """The live state of one rule of `key` at `level`, as `inspect` reports it."""
    return limiter.inspect(level, key)[index]["state"]


def allowed_in_a_row(limiter, keys, times, cost=1, priority=None):
    """The `allowed` flag of `times` acquires made one after the other."""
    return [limiter.acquire(keys, cost, priority).allowed for _ in range(times)]


def move_to(clock, t):
    """Set the manual clock to exactly `t` (edges are tested at exact times, not near them)."""
    clock.advance(t - clock())
    assert clock() == t, f"the clock reads {clock()!r}, not {t!r}"


class LifetimeQuota(Rule):
    """A stateful plug-in with no Lua twin (so the Redis store decides it optimistically,
    with WATCH/MULTI): at most `total` cost per key, ever. Register a subclass of it, under a
    name of the test's own, with `register_lifetime_quota`."""

    params = (Param("total", help="Cost allowed over the key's lifetime.", minimum=1),)

    def setup(self):
        self.capacity = float(self.total)

    def wait(self, state, now, cost, floor):
        spent = state[2] if state else 0.0
        return 0.0 if spent + cost + floor <= self.capacity + 1e-9 else math.inf

    def take(self, state, now, cost, lease):
        spent = (state[2] if state else 0.0) + cost
        return now + 86400, self.capacity - spent, spent

    def remaining(self, state, now):
        return self.capacity - (state[2] if state else 0.0)


def register_lifetime_quota(name):
    """Register a LifetimeQuota of its own under `name`; the caller unregisters it."""
    return register(name)(type(f"LifetimeQuota_{name}", (LifetimeQuota,), {}))


def quota(limit, period, **extra):
    return {"type": "quota", "limit": limit, "period": period, **extra}
