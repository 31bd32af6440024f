"""A gunicorn worker killed with SIGKILL under load (an out-of-memory kill, a segfault): the
arbiter starts a new one, and no request that was not on the dead worker notices.

What may fail, exactly. A connection belongs to the worker that accepted it, so the kill
can break only requests that were on that worker's connections:
- a request in flight there (sent before the kill, not yet answered) gets no answer (the
  connection is reset or closed): it may or may not have been decided;
- on a kept-alive connection of the dead worker, the next request the client sends finds
  the connection closed (`RemoteDisconnected`): it never reached a worker.
Every other request is answered, with a 200: every request sent on a new connection after
the kill, and every later request of a client that opened a new connection after its error.
A client should retry once on a new connection. A decision is not idempotent: a retried
request that had been decided before the worker died is counted twice (at most once more
per retry), so gateways retry once, not in a loop. The test runs both kinds of client at
once, 100 requests a second each.
"""

import os
import signal

import pytest

from .conftest import sleep_until, wait_for, warm
from .load import Load, describe

pytestmark = pytest.mark.slow

WORKERS = 3
RATE, DURATION, KILL_AT = 100, 9.0, 3.0  # per kind of client
# How long after os.kill a request may still be caught by the dying worker: SIGKILL is
# delivered at once, and the kernel closes the worker's sockets as it goes.
DYING = 0.05
POLICY = {
    "default_tier": "t",
    "levels": [{"name": "user", "fail_mode": "open"}],
    "tiers": {"t": {"user": [{"type": "token_bucket", "capacity": 1_000_000, "per_second": 0}]}},
}


def request_for(i: int) -> tuple[str, dict]:
    return "/api/v1/decisions", {"keys": {"user": f"u{i % 100}"}}


def test_a_worker_killed_under_load_is_replaced_and_only_its_own_requests_fail(redis_url):
    from tests.serving import Service

    with Service(POLICY, redis_url=redis_url, workers=WORKERS) as service:
        warm(service, requests=60)
        before = service.worker_pids()
        assert len(before) == WORKERS
        fresh = Load(service, request_for, rate=RATE, duration=DURATION, clients=16, fresh_connections=True).start()
        kept = Load(service, request_for, rate=RATE, duration=DURATION, clients=16).start()
        sleep_until(fresh, KILL_AT)
        victim = before[0]
        os.kill(victim, signal.SIGKILL)
        killed_fresh, killed_kept = fresh.now(), kept.now()
        after = wait_for(
            lambda: _replaced(service, before, victim), within=20.0, what="a new worker in place of the killed one"
        )
        replaced_in = fresh.now() - killed_fresh
        fresh_answers, kept_answers = fresh.join(), kept.join()
        assert service.process.poll() is None, "the arbiter died"

    failed_fresh = [a for a in fresh_answers if a.status != 200]
    failed_kept = [a for a in kept_answers if a.status != 200]
    print(
        f"\nworker {victim} killed at {killed_fresh:.2f} s, replaced by {set(after) - set(before)} "
        f"{replaced_in:.2f} s later; new connections: {describe(fresh_answers)}; "
        f"kept-alive: {describe(kept_answers)}; "
        f"errors: {sorted({a.error.split(':')[0] for a in failed_fresh + failed_kept})}"
    )

    assert len(after) == WORKERS and victim not in after
    # No error ever comes from a worker that lives: no 5xx, only connections the dead one broke.
    assert all(a.status is None for a in failed_fresh + failed_kept)
    # New connections: only a request that was in flight when the worker died.
    for a in failed_fresh:
        assert a.started < killed_fresh + DYING <= a.ended + DYING, a
    assert all(a.status == 200 for a in fresh_answers if a.started >= killed_fresh + DYING)
    # Kept-alive connections: each fails at most once, on its first request in flight at or
    # sent after the kill; the client reconnects and is answered from then on.
    for a in failed_kept:
        assert a.ended >= killed_kept, a
        earlier = [b for b in kept_answers if b.connection == a.connection and killed_kept <= b.ended < a.ended]
        assert earlier == [], (a, earlier)
    assert len({a.connection for a in failed_kept}) == len(failed_kept)
    # Most clients never noticed: the dead worker had a third of the connections at most.
    assert len(failed_kept) < kept.clients
    assert len(fresh_answers) == len(kept_answers) == RATE * DURATION


def _replaced(service, before: list[int], victim: int):
    pids = service.worker_pids()
    return pids if victim not in pids and len(pids) == len(before) else None
