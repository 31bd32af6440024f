"""Fixtures and helpers for the fault tests: the real service under gunicorn (tests.serving),
a redis-server of the test's own that it may kill, and a paced load on 127.0.0.1 (load.py).

Every test here reads the wall clock: latency and recovery under faults are what they
measure. Sleeping only paces a load or waits for a planned moment; no test aims at an edge.
"""

from __future__ import annotations

import time

import pytest

from tests.conftest import RedisServer


def warm(service, requests: int = 40, body: dict | None = None) -> None:
    """Make every worker import what it imports lazily and read the policy, on connections of
    their own (each request a new connection, so that any worker may accept it): the first
    decision of a worker costs about a hundred milliseconds, which is no fault's doing."""
    body = body or {"keys": {"user": "warm-up"}}
    for _ in range(requests):
        status, answer = service.post("/api/v1/decisions", body)
        assert status == 200, answer


def wait_for(condition, within: float, every: float = 0.05, what: str = "the condition"):
    """Poll `condition` until it returns something true; fail after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not hold within {within} s")
        time.sleep(every)  # polling, not an edge


def sleep_until(load, moment: float) -> None:
    """Wait until `moment` seconds into `load`: the planned time of a fault."""
    wait = moment - load.now()
    if wait > 0:
        time.sleep(wait)


@pytest.fixture
def persistent_redis(tmp_path):
    """A redis-server with an append-only file fsynced every second (what docs/OPERATIONS.md
    recommends), which the test may kill, shut down and start again on the same files."""
    server = RedisServer(tmp_path, options=("--appendonly", "yes", "--appendfsync", "everysec"))
    server.start()
    yield server
    server.kill()
