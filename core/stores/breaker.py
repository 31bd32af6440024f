"""The circuit breaker of a remote store: after a few failures in a row, calls fail at once
for a while instead of each paying the network's timeout."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .base import Health


class CircuitBreaker:
    """Open after `threshold` failures in a row: calls then fail at once, without touching
    the network, until the backoff has passed; then calls may try again. The backoff doubles
    up to `most`. A single slow reply (a busy host) does not open it; a dead Redis, which
    fails every call, opens it within a few calls. Thread-safe: it holds its own lock."""

    def __init__(
        self, first: float = 0.05, most: float = 0.5, threshold: int = 3, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.first, self.most, self.threshold, self.clock = first, most, threshold, clock
        self.failures = 0
        self.probing = False
        self.backoff = 0.0
        self.open_until = 0.0
        self.down_since: float | None = None  # `clock` time of the first failure
        self._lock = threading.Lock()

    def allows(self) -> bool:
        """Closed: yes. Open: no, until the backoff has passed; then yes for one caller at a
        time (the probe), so that a frozen Redis costs one timeout per backoff, not one per
        waiting thread."""
        if not self.open_until:  # read without the lock: the common case costs nothing
            return True
        with self._lock:
            if not self.open_until:
                return True
            if self.probing or self.clock() < self.open_until:
                return False
            self.probing = True
            return True

    def succeeded(self) -> None:
        if not (self.failures or self.probing):
            return
        with self._lock:
            if self.failures:
                self.failures, self.backoff, self.open_until, self.down_since = 0, 0.0, 0.0, None
            self.probing = False

    def failed(self) -> None:
        with self._lock:
            now = self.clock()
            self.failures += 1
            self.probing = False
            if self.down_since is None:
                self.down_since = now
            if self.failures >= self.threshold:
                self.backoff = min(self.most, self.backoff * 2 or self.first)
                self.open_until = now + self.backoff

    def interrupted(self) -> None:
        """A call ended by something other than the store's answer or failure (an error of
        ours, an interrupt): the next probe may go."""
        with self._lock:
            self.probing = False

    def health(self, name: str) -> Health:
        """What operators see of it, `down_since` in wall-clock time."""
        down_since = self.down_since
        since = None if down_since is None else time.time() - (self.clock() - down_since)
        return Health(name=name, state="up" if since is None else "down", down_since=since, failures=self.failures)
