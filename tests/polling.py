"""Waiting for what another thread or process does: polled, never slept to an edge."""

import time


def until(condition, timeout: float = 10.0, every: float = 0.05):
    """`condition()` once it holds, or its last value when `timeout` seconds run out."""
    deadline = time.monotonic() + timeout
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(every)  # polling, not aiming at an edge
    return value
