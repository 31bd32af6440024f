"""A client of Limiter Admin's REST API (v1), on the standard library alone.

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
which would count that request twice.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, Literal
from urllib.parse import quote, urlsplit

from .decision import OK, Decision
from .errors import LimiterError

API_PREFIX = "/api/v1"
# A denial that says "retry now" (it should not happen) is retried after this, not at once.
MIN_WAIT = 0.01
USER_AGENT = "limiter-admin-client/1"
# The errors of a kept-alive connection that the server closed while it was idle.
_STALE_CONNECTION = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, http.client.RemoteDisconnected)


class LimiterAPIError(LimiterError):
    """The API answered with an error: `code` and `message` from its error shape, `fields`
    mapping request fields to what is wrong with them, `status` the HTTP status."""

    def __init__(
        self, code: str, message: str, fields: Mapping[str, str] | None = None, status: int | None = None
    ) -> None:
        self.code, self.message, self.fields, self.status = code, message, dict(fields or {}), status
        super().__init__(f"{status} {code}: {message}" if status else f"{code}: {message}")


class LimiterUnavailable(LimiterError):
    """The API could not be reached, or did not answer within the client's timeout."""


class RateLimited(LimiterError):
    """A reservation was denied; `decision` has the wait (`retry_after`) and `blocked_by`."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        wait = "never fits" if math.isinf(decision.retry_after) else f"retry after {decision.retry_after:g} s"
        super().__init__(f"rate limited by {decision.blocked_by} ({decision.reason}): {wait}")


def decision_from_json(data: Any, status: int | None = None) -> Decision:
    """A Decision from the API's JSON; null `retry_after` and `remaining` are math.inf."""
    if not isinstance(data, dict) or not isinstance(data.get("allowed"), bool):
        raise LimiterAPIError("bad_response", f"not a decision: {str(data)[:200]}", status=status)
    retry_after, remaining = data.get("retry_after", 0.0), data.get("remaining")
    return Decision(
        allowed=data["allowed"],
        retry_after=math.inf if retry_after is None else float(retry_after),
        blocked_by=data.get("blocked_by"),
        reason=data.get("reason") or OK,
        remaining=math.inf if remaining is None else float(remaining),
        degraded=bool(data.get("degraded", False)),
        lease=data.get("lease"),
        shadow_blocked=tuple(data.get("shadow_blocked") or ()),
        over_quota=tuple(data.get("over_quota") or ()),
    )


def wait_until_allowed(
    decide: Callable[[], Decision], timeout: float | None, clock: Callable[[], float], sleep: Callable[[float], None]
) -> Decision:
    """Ask `decide()` until it allows, sleeping its `retry_after` in between (as
    core.Throttle does in process). Gives up, returning the last denial, as soon as the wait would end past
    `timeout` seconds from now, so it never sleeps past the deadline; at once when the wait
    is infinite. `timeout=None` waits as long as it takes."""
    deadline = math.inf if timeout is None else clock() + max(0.0, timeout)
    while True:
        decision = decide()
        if decision.allowed:
            return decision
        wait = max(decision.retry_after, MIN_WAIT)
        if math.isinf(wait) or clock() + wait > deadline:
            return decision
        sleep(wait)


class RemoteReservation:
    """A cost held by the API's server until settled (in-process, the engine's own is
    core.Reservation). As a context manager it commits on a clean exit (with `actual_cost`
    if set, else the reserved `cost`) and cancels on an exception.

    `id` is None when the API allowed without a reservation (a fail mode decided while its
    store was down): there is nothing to settle, and settling does nothing.
    """

    def __init__(self, client: LimiterClient, body: dict, cost: float, status: int) -> None:
        self.client = client
        self.decision = decision_from_json(body, status)
        self.allowed = self.decision.allowed
        self.id: str | None = body.get("id")
        self.expires_at = _parse_time(body.get("expires_at"))
        self.cost = cost
        self.actual_cost: float | None = None
        self.settlement: dict | None = None  # the server's answer to commit or cancel
        self.settled = self.id is None

    def commit(self, actual_cost: float | None = None) -> dict | None:
        """Settle with the actual cost (default: `actual_cost`, else the reserved cost):
        the excess is refunded, a shortfall charged, concurrency slots released."""
        if actual_cost is None:
            actual_cost = self.actual_cost if self.actual_cost is not None else self.cost
        return self._settle("commit", {"actual_cost": actual_cost})

    def cancel(self) -> dict | None:
        """Refund everything and release the slots."""
        return self._settle("cancel", {})

    def _settle(self, action: str, body: dict) -> dict | None:
        if self.id is None:
            return None
        try:
            self.settlement = self.client._post(f"/reservations/{quote(self.id, safe='')}/{action}", body)[1]
        except LimiterAPIError as error:
            if error.status in (404, 409):  # expired or settled: it is not open any more
                self.settled = True
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

    def __repr__(self) -> str:
        state = "settled" if self.settled else f"open until {self.expires_at}"
        return f"<RemoteReservation {self.id} cost={self.cost!r} {state}>"


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
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"base_url must be an http:// or https:// URL, got {base_url!r}")
        self.base_url = base_url
        self._connection_class = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        self._host, self._port = url.hostname, url.port
        self._prefix = url.path.rstrip("/") + API_PREFIX
        self._headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        }
        self.timeout, self.clock, self.sleep = timeout, clock, sleep
        self._local = threading.local()
        self._connections: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    # Decisions ------------------------------------------------------------------------------

    def decide(
        self, keys: Mapping[str, str], cost: float = 1, priority: str | None = None, dry_run: bool = False
    ) -> Decision:
        """May this request go now? Takes `cost` at every level of `keys`, or nothing."""
        body = {"keys": dict(keys), "cost": cost, "priority": priority, "dry_run": dry_run}
        status, data = self._post("/decisions", body)
        return decision_from_json(data, status)

    def decide_batch(self, requests: Iterable[Mapping[str, Any]]) -> list[Decision]:
        """Many decisions in one round trip, in order, each as if made after the one before.
        Each request is a mapping with `keys` and optionally `cost` and `priority`."""
        status, data = self._post("/decisions/batch", {"requests": [dict(r) for r in requests]})
        decisions = data.get("decisions") if isinstance(data, dict) else None
        if not isinstance(decisions, list):
            raise LimiterAPIError("bad_response", f"no decisions in {str(data)[:200]}", status=status)
        return [decision_from_json(item, status) for item in decisions]

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
            self._post(f"/leases/{quote(lease, safe='')}/release", {})
        except LimiterAPIError as error:
            if error.status == 404:
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
        body = {"keys": dict(keys), "cost": cost, "priority": priority}
        if hold is not None:
            body["hold"] = hold
        status, data = self._post("/reservations", body)
        reservation = RemoteReservation(self, data if isinstance(data, dict) else {}, cost, status)
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
        payload = json.dumps(body, allow_nan=False).encode()
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
            data = _json(raw)
            if not 200 <= response.status < 300:
                raise _api_error(response.status, response.reason, data, raw)
            return response.status, data
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


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def _api_error(status: int, reason: str, data: Any, raw: bytes) -> LimiterAPIError:
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        fields = error.get("fields") if isinstance(error.get("fields"), dict) else {}
        return LimiterAPIError(error["code"], str(error.get("message", "")), fields, status)
    text = raw[:200].decode("utf-8", "replace").strip() or reason
    return LimiterAPIError(f"http_{status}", text, {}, status)


def _parse_time(value: Any) -> datetime | None:
    """ISO 8601 (a trailing Z included) to an aware datetime; None when absent."""
    if not isinstance(value, str):
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
