"""The clients of Limiter Admin's REST API (v1), on the standard library alone: the
synchronous `LimiterClient` here, and `AsyncLimiterClient` for asyncio programs
(core/async_client.py, with the same calls awaited). What both read and raise is
core/remote.py's, imported from here too.

    client = LimiterClient("http://127.0.0.1:8000", token)
    d = client.decide({"user": "u1", "team": "acme", "global": "*"}, cost=1)
    d = client.acquire(keys, cost=estimate, timeout=10.0)   # waits on retry_after
    if d.allowed: ...
    with client.reserve(keys, cost=estimate) as reservation:  # RateLimited when denied
        reservation.actual_cost = call_the_model()            # committed on exit
    with client.slot(keys) as d:       # RateLimited when denied; a concurrency slot, if the
        call_the_model()               # policy has one, is released on exit
    client.release(d.lease)            # by hand: True when freed, False when it was not held
    client.what_if(draft, "1h")        # an operator's (admin token): the replay's answer

Answers are `core.Decision`s, as the engine's own (`retry_after` null in JSON is math.inf:
the cost can never fit; so is a null `remaining`). Errors:

- `LimiterAPIError(code, message, fields, status)`: the API answered with an error (4xx or
  5xx), parsed from its shape `{"error": {"code", "message", "fields"}}`; an answer in another
  shape (a proxy's 502 page) has code `http_<status>`.
- `LimiterUnavailable`: no answer at all (refused, reset, timed out after `timeout` seconds).
  What to do then (fail open or closed) is the caller's choice; the client does not guess.
- `RateLimited`: `reserve()` was denied; `.decision` says why and for how long.

Each thread keeps one HTTP/1.1 keep-alive connection. A request that fails because the server
closed an idle kept-alive connection is sent once more on a new one: the usual practice (and
urllib3's); the server may in rare cases have decided the first before the connection broke,
which would count that request twice. (The asyncio client shares keep-alive connections
among its tasks instead.)
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Literal

from .async_client import AsyncLimiterClient, AsyncRemoteReservation, AsyncSlot
from .decision import Decision
from .errors import LimiterError
from .remote import (
    API_PREFIX,
    MIN_WAIT,
    NOT_HELD,
    USER_AGENT,
    Endpoint,
    LimiterAPIError,
    LimiterUnavailable,
    RateLimited,
    ReservationAnswer,
    batch_body,
    deadline_of,
    decide_body,
    decision_from_json,
    decisions_from_json,
    encode,
    next_wait,
    read_answer,
    release_path,
    reservation_body,
    settle_path,
)

__all__ = [
    "API_PREFIX",
    "MIN_WAIT",
    "USER_AGENT",
    "AsyncLimiterClient",
    "AsyncRemoteReservation",
    "AsyncSlot",
    "LimiterAPIError",
    "LimiterClient",
    "LimiterUnavailable",
    "RateLimited",
    "RemoteReservation",
    "Slot",
    "decision_from_json",
    "wait_until_allowed",
]

# The errors of a kept-alive connection that the server closed while it was idle.
_STALE_CONNECTION = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, http.client.RemoteDisconnected)


def wait_until_allowed(
    decide: Callable[[], Decision], timeout: float | None, clock: Callable[[], float], sleep: Callable[[float], None]
) -> Decision:
    """Ask `decide()` until it allows, sleeping its `retry_after` in between (as
    core.Throttle does in process). Gives up, returning the last denial, as soon as the wait would end past
    `timeout` seconds from now, so it never sleeps past the deadline; at once when the wait
    is infinite. `timeout=None` waits as long as it takes."""
    deadline = deadline_of(clock(), timeout)
    while True:
        decision = decide()
        wait = next_wait(decision, clock(), deadline)
        if wait is None:
            return decision
        sleep(wait)


class RemoteReservation(ReservationAnswer):
    """A cost held by the API's server until settled (in-process, the engine's own is
    core.Reservation). As a context manager it commits on a clean exit (with `actual_cost`
    if set, else the reserved `cost`) and cancels on an exception.

    `id` is None when the API allowed without a reservation (a fail mode decided while its
    store was down): there is nothing to settle, and settling does nothing.
    """

    def __init__(self, client: LimiterClient, body: Any, cost: float, status: int) -> None:
        super().__init__(body, cost, status)
        self.client = client

    def commit(self, actual_cost: float | None = None) -> dict | None:
        """Settle with the actual cost (default: `actual_cost`, else the reserved cost):
        the excess is refunded, a shortfall charged, concurrency slots released."""
        return self._settle("commit", self.commit_body(actual_cost))

    def cancel(self) -> dict | None:
        """Refund everything and release the slots."""
        return self._settle("cancel", {})

    def _settle(self, action: str, body: dict) -> dict | None:
        if self.id is None:
            return None
        try:
            self.settlement = self.client._post(settle_path(self.id, action), body)[1]
        except LimiterAPIError as error:
            self.settle_failed(error)
            raise
        self.settled = True
        return self.settlement

    def __enter__(self) -> RemoteReservation:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> Literal[False]:
        if self.settled:
            return False
        if exc is None:
            self.commit()
            return False
        try:
            self.cancel()
        except LimiterError as error:  # the body's exception is the one to see
            exc.add_note(f"cancelling reservation {self.id} failed too: {error}")
        return False


class Slot:
    """An allowed decision held for the length of a `with` block: its concurrency slot, if
    it took one, is released on exit (`released`: whether the server freed one)."""

    def __init__(self, client: LimiterClient, decision: Decision) -> None:
        self.client, self.decision, self.released = client, decision, False

    def __enter__(self) -> Decision:
        return self.decision

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> Literal[False]:
        try:
            self.released = self.client.release(self.decision.lease)
        except LimiterError as error:
            if exc is None:
                raise
            exc.add_note(f"releasing lease {self.decision.lease} failed too: {error}")  # the body's error first
        return False


class LimiterClient:
    """Decisions and reservations over the REST API, as `Authorization: Bearer <token>`.
    `timeout` bounds each HTTP request; `clock` and `sleep` are what `acquire` waits with."""

    def __init__(
        self,
        base_url: str,
        token: str,
        timeout: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        endpoint = Endpoint(base_url)
        self.base_url = base_url
        self._connection_class = http.client.HTTPSConnection if endpoint.https else http.client.HTTPConnection
        self._host, self._port = endpoint.host, endpoint.explicit_port
        self._prefix = endpoint.prefix
        self._headers = endpoint.headers(token)
        self.timeout, self.clock, self.sleep = timeout, clock, sleep
        self._local = threading.local()
        self._connections: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    # Decisions ------------------------------------------------------------------------------

    def decide(
        self, keys: Mapping[str, str], cost: float = 1, priority: str | None = None, dry_run: bool = False
    ) -> Decision:
        """May this request go now? Takes `cost` at every level of `keys`, or nothing."""
        status, data = self._post("/decisions", decide_body(keys, cost, priority, dry_run))
        return decision_from_json(data, status)

    def decide_batch(self, requests: Iterable[Mapping[str, Any]]) -> list[Decision]:
        """Many decisions in one round trip, in order, each as if made after the one before.
        Each request is a mapping with `keys` and optionally `cost` and `priority`."""
        status, data = self._post("/decisions/batch", batch_body(requests))
        return decisions_from_json(data, status)

    def acquire(
        self, keys: Mapping[str, str], cost: float = 1, timeout: float | None = 10.0, priority: str | None = None
    ) -> Decision:
        """Block until the request may go: core.Throttle's waiting, with the server deciding.

        Sleeps each denial's `retry_after` and asks again. Returns the allowing decision, or
        the last denial as soon as waiting would end past `timeout` seconds from the call
        (it never sleeps past that deadline), or at once when the wait is infinite (the cost
        can never fit). The check is `.allowed`, as for `decide`; it never raises for a denial.
        """
        return wait_until_allowed(lambda: self.decide(keys, cost, priority), timeout, self.clock, self.sleep)

    def release(self, lease: str | None) -> bool:
        """Hand back the concurrency slot a decision's `lease` holds. True when it was freed;
        False when there was nothing to free: no lease (None), released already, run out, or
        the server's store was down (the slot then comes back when its lease runs out)."""
        if lease is None:
            return False
        try:
            self._post(release_path(lease), {})
        except LimiterAPIError as error:
            if error.status == NOT_HELD:
                return False
            raise
        return True

    def slot(
        self, keys: Mapping[str, str], cost: float = 1, priority: str | None = None, timeout: float | None = None
    ) -> Slot:
        """`decide` (or, with a `timeout`, `acquire`) as a context manager: RateLimited when
        denied; on exit, whatever the body did, the decision's concurrency slot (if it took
        one) is released."""
        if timeout is None:
            decision = self.decide(keys, cost, priority)
        else:
            decision = self.acquire(keys, cost, timeout, priority)
        if not decision.allowed:
            raise RateLimited(decision)
        return Slot(self, decision)

    # Reservations ---------------------------------------------------------------------------

    def reserve(
        self, keys: Mapping[str, str], cost: float = 1, priority: str | None = None, hold: float | None = None
    ) -> RemoteReservation:
        """Reserve an estimated cost (and any concurrency slots) until settled or `hold`
        seconds pass (the server's default when None). Raises RateLimited when denied, so
        the body of `with client.reserve(...)` runs only with the reservation made."""
        status, data = self._post("/reservations", reservation_body(keys, cost, priority, hold))
        reservation = RemoteReservation(self, data, cost, status)
        if not reservation.allowed:
            raise RateLimited(reservation.decision)
        return reservation

    # Operators ------------------------------------------------------------------------------

    def what_if(self, policy: Any, window: str = "1h", top: int = 100) -> dict:
        """`POST /whatif` (an admin-scope token): the server's recent traffic replayed under its
        policy and under `policy` (a draft: a policy document, whole or partial); the answer
        as the API gives it. A replay may take minutes: give the client a `timeout` to match."""
        status, data = self._post("/whatif", {"policy": policy, "window": window, "top": top})
        if not isinstance(data, dict):
            raise LimiterAPIError("bad_response", f"no what-if answer in {str(data)[:200]}", status=status)
        return data

    # HTTP -----------------------------------------------------------------------------------

    def _post(self, path: str, body: dict) -> tuple[int, Any]:
        """POST JSON; (status, parsed JSON) of a 2xx answer, else LimiterAPIError."""
        payload = encode(body)
        for attempt in (1, 2):
            connection = self._connection()
            reused = connection.sock is not None
            try:
                connection.request("POST", self._prefix + path, payload, self._headers)
                response = connection.getresponse()
                raw = response.read()
            except _STALE_CONNECTION as error:
                connection.close()
                if reused and attempt == 1:
                    continue
                raise LimiterUnavailable(f"{self.base_url}: connection lost: {error!r}") from error
            except (OSError, http.client.HTTPException) as error:
                connection.close()
                raise LimiterUnavailable(f"{self.base_url}: no answer: {error!r}") from error
            return response.status, read_answer(response.status, response.reason, raw)
        raise AssertionError("unreachable")

    def _connection(self) -> http.client.HTTPConnection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._connection_class(self._host, self._port, timeout=self.timeout)
            self._local.connection = connection
            with self._lock:
                self._connections.append(connection)
        return connection

    def close(self) -> None:
        """Close every thread's connection; the client opens new ones if used again."""
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()
        self._local = threading.local()

    def __enter__(self) -> LimiterClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<LimiterClient {self.base_url}>"
