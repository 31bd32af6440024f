"""Small helpers shared by the engine's tests."""

# One tick before an edge: far below every window and rate used in these tests, far above
# the engine's float slack (1e-9), so "one tick early" is always a real denial.
TICK = 1e-6


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
