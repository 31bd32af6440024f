"""A paced load on the service: `rate` requests a second for `duration` seconds, from
`clients` threads on 127.0.0.1, each answer recorded with when it was sent and how long it
took. Times are seconds since the load started (`Load.now()`), so a test can note when it
did something to Redis or a worker and compare.

    load = Load(service, lambda i: ("/api/v1/decisions", {"keys": {"user": f"u{i}"}}),
                rate=300, duration=20).start()
    ...; load.now(); ...
    answers = load.join()

The pace is open-loop: request i is due at i / rate, whatever the answers before it took, so
a slow answer does not hide the requests that would have queued behind it (a client falls
behind and sends late, it never skips). Each client keeps one keep-alive connection, as a
gateway would, and opens a new one after an error; `fresh_connections=True` opens one per
request instead, so that a request is tied to the worker that accepted it alone.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# The longest any one request may take before the client gives up on it.
REQUEST_TIMEOUT = 10.0


@dataclass
class Answer:
    index: int
    path: str
    sent: dict
    started: float  # seconds since the load started
    took: float  # seconds
    status: int | None  # None: no HTTP answer at all (`error` says why)
    body: dict = field(default_factory=dict)
    error: str = ""
    connection: int = 0  # which client thread's connection (fresh or kept alive)
    reused: bool = False  # sent on a connection that had already carried a request

    @property
    def ended(self) -> float:
        return self.started + self.took


class Load:
    def __init__(
        self,
        service,
        request: Callable[[int], tuple[str, dict]],
        rate: float,
        duration: float,
        clients: int = 32,
        fresh_connections: bool = False,
    ) -> None:
        self.service, self.request = service, request
        self.rate, self.duration, self.clients = rate, duration, clients
        self.fresh_connections = fresh_connections
        self.total = int(rate * duration)
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._t0 = 0.0

    def now(self) -> float:
        return time.monotonic() - self._t0

    def start(self) -> Load:
        self._t0 = time.monotonic() + 0.05
        self._threads = [threading.Thread(target=self._client, args=(k,), daemon=True) for k in range(self.clients)]
        for thread in self._threads:
            thread.start()
        return self

    def join(self) -> list[Answer]:
        # Every client stops by itself: its last request is due at `duration`, and each
        # request gives up after REQUEST_TIMEOUT.
        for thread in self._threads:
            thread.join(self.duration + 3 * REQUEST_TIMEOUT)
            assert not thread.is_alive(), "a load client did not stop"
        return sorted(self.answers, key=lambda a: a.started)

    def run(self) -> list[Answer]:
        return self.start().join()

    def _client(self, k: int) -> None:
        connection, used = None, False
        for i in range(k, self.total, self.clients):
            delay = self._t0 + i / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # pacing the stream, not aiming at an edge
            if connection is None or self.fresh_connections:
                connection, used = self.service.connection(timeout=REQUEST_TIMEOUT), False
            path, body = self.request(i)
            answer = self._send(connection, i, path, body, k, used)
            used = True
            if answer.status is None or self.fresh_connections:
                connection.close()
                connection = None
            with self._lock:
                self.answers.append(answer)
        if connection is not None:
            connection.close()

    def _send(self, connection, i: int, path: str, body: dict, k: int, reused: bool) -> Answer:
        headers = {"Authorization": f"Bearer {self.service.token}", "Content-Type": "application/json"}
        started = time.monotonic()
        try:
            connection.request("POST", path, json.dumps(body), headers)
            response = connection.getresponse()
            raw = response.read()
            took = time.monotonic() - started
            parsed = json.loads(raw) if raw.startswith(b"{") else {}
            return Answer(i, path, body, started - self._t0, took, response.status, parsed, connection=k, reused=reused)
        except (OSError, http.client.HTTPException) as error:
            return Answer(
                i,
                path,
                body,
                started - self._t0,
                time.monotonic() - started,
                None,
                error=f"{type(error).__name__}: {error}",
                connection=k,
                reused=reused,
            )


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank) of `values`; nan when there are none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def describe(answers: list[Answer]) -> str:
    """A line for an assertion message or the report."""
    statuses: dict = {}
    for answer in answers:
        statuses[answer.status] = statuses.get(answer.status, 0) + 1
    took = [a.took for a in answers]
    return (
        f"{len(answers)} requests, statuses {statuses}, p50 {percentile(took, 50) * 1000:.1f} ms, "
        f"p99 {percentile(took, 99) * 1000:.1f} ms, max {max(took, default=0) * 1000:.1f} ms"
    )
