"""Clocks: a callable returning seconds. Time is injected, never patched."""

import time

monotonic = time.monotonic


class ManualClock:
    """A clock that only moves when told to; tests use it to hit edges exactly."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        """A stand-in for time.sleep that advances this clock instead of waiting."""
        self.advance(seconds)
