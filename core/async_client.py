"""The asyncio client of Limiter Admin's REST API (v1), on the standard library alone
(asyncio streams: measured against httpx and aiohttp in bench/async_client.py). Imported
from core.client, beside the synchronous LimiterClient, with its calls, answers and errors:

    client = AsyncLimiterClient("http://127.0.0.1:8000", token)
    d = await client.decide({"user": "u1", "team": "acme", "global": "*"}, cost=1)
    d = await client.acquire(keys, cost=estimate, timeout=10.0)  # awaits retry_after
    async with client.reserve(keys, cost=estimate) as reservation:  # RateLimited when denied
        reservation.actual_cost = await call_the_model()            # committed on exit
    reservation = await client.reserve(keys, cost=estimate)  # held across two hooks, then
    await reservation.commit(actual_cost)                     # settled by hand
    async with client.slot(keys) as d: ...   # a concurrency slot released on exit
    await client.release(d.lease)
    await client.aclose()

A reservation's block that ends with an exception, `asyncio.CancelledError` included (a
client that went away: it is no Exception), cancels the reservation at once and re-raises.
Each settlement, and the request that makes a reservation or takes a slot, runs shielded in
a task of its own: a task cancelled while one is in flight does not cut it short, and a
reservation (or slot) made for a task cancelled meanwhile is cancelled (released) as soon as
its answer arrives. `aclose()` waits for these. What the process does not live to send, the
reservation's `hold` (or the slot's lease) gives back when it runs out.

Connections are HTTP/1.1 keep-alive, at most `max_connections` at once (a request past that
waits for one, within its `timeout`), shared by every task of the one event loop that the
client belongs to (the first it is used on). A kept-alive connection that the server closed
while idle is replaced once, as LimiterClient does. Nothing blocks the loop: names are
resolved by the loop's resolver, the TLS context is made in a thread.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Mapping
from types import TracebackType
from typing import Any, Literal

from .decision import Decision
from .errors import LimiterError
from .remote import (
    NOT_HELD,
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

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 32
# The errors of a kept-alive connection that the server closed while it was idle: met before
# any byte of the answer, the request is sent once more on a new connection.
STALE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, asyncio.IncompleteReadError)


class BadAnswer(Exception):
    """The server's bytes are no HTTP/1.1 answer."""


class Connection:
    """One HTTP/1.1 keep-alive connection: a request written, its answer read."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.reusable = True
        self.answered = False  # whether any byte of the current answer came

    def closed_by_server(self) -> bool:
        return self.reader.at_eof() or self.writer.is_closing()

    async def exchange(self, request: bytes) -> tuple[int, str, bytes]:
        """Send `request`; (status, reason, body) of the answer."""
        self.answered = False
        self.writer.write(request)
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        self.answered = True
        lines = head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise BadAnswer(f"not an HTTP/1.1 status line: {lines[0][:100]!r}")
        fields = {}
        for line in lines[1:-2]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        status = int(code)
        connection = fields.get("connection", "").lower()
        self.reusable = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        body = await self.read_body(status, fields)
        return status, reason, body

    async def read_body(self, status: int, fields: Mapping[str, str]) -> bytes:
        if status in (204, 304) or 100 <= status < 200:
            return b""
        if "chunked" in fields.get("transfer-encoding", "").lower():
            return await self.read_chunks()
        length = fields.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise BadAnswer(f"Content-Length is no number: {length[:40]!r}")
            return await self.reader.readexactly(int(length))
        self.reusable = False  # the answer ends where the connection does
        return await self.reader.read()

    async def read_chunks(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size_line = await self.reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise BadAnswer(f"not a chunk's size: {size_line[:40]!r}") from None
            if size == 0:
                while await self.reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields, if any
                    pass
                return b"".join(parts)
            parts.append((await self.reader.readexactly(size + 2))[:-2])

    def close(self) -> None:
        self.writer.close()  # the transport closes at once; nothing to wait for


class AsyncLimiterClient:
    """Decisions and reservations over the REST API, as `Authorization: Bearer <token>`, for
    asyncio programs. `timeout` bounds each request (waiting for a connection included);
    `clock` and `sleep` (a coroutine function) are what `acquire` waits with."""

    def __init__(
        self,
        base_url: str,
        token: str,
        timeout: float = 2.0,
        max_connections: int = MAX_CONNECTIONS,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections!r}")
        self.endpoint = Endpoint(base_url)
        self.base_url = base_url
        self.timeout, self.clock, self.sleep = timeout, clock, sleep
        self.max_connections = max_connections
        host = f"[{self.endpoint.host}]" if ":" in self.endpoint.host else self.endpoint.host
        if self.endpoint.explicit_port is not None:
            host += f":{self.endpoint.explicit_port}"
        fields = {"Host": host, **self.endpoint.headers(token)}
        self._head = "".join(f"{name}: {value}\r\n" for name, value in fields.items())
        self._idle: deque[Connection] = deque()
        self._slots = asyncio.Semaphore(max_connections)
        self._background: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tls: ssl.SSLContext | None = None
        self.connections_opened = 0  # over the client's life: how often keep-alive missed

    # Decisions ------------------------------------------------------------------------------

    async def decide(
        self, keys: Mapping[str, str], cost: float = 1, priority: str | None = None, dry_run: bool = False
    ) -> Decision:
        """May this request go now? Takes `cost` at every level of `keys`, or nothing."""
        status, data = await self._post("/decisions", decide_body(keys, cost, priority, dry_run))
        return decision_from_json(data, status)

    async def decide_batch(self, requests: Iterable[Mapping[str, Any]]) -> list[Decision]:
        """Many decisions in one round trip, in order, each as if made after the one before.
        Each request is a mapping with `keys` and optionally `cost` and `priority`."""
        status, data = await self._post("/decisions/batch", batch_body(requests))
        return decisions_from_json(data, status)

    async def acquire(
        self, keys: Mapping[str, str], cost: float = 1, timeout: float | None = 10.0, priority: str | None = None
    ) -> Decision:
        """Wait until the request may go, awaiting each denial's `retry_after` (the loop runs
        on meanwhile). The allowing decision, or the last denial as soon as waiting would end
        past `timeout` seconds from the call, or at once when the wait is infinite: as
        LimiterClient.acquire, whose rule (core.remote.next_wait) it shares."""
        deadline = deadline_of(self.clock(), timeout)
        while True:
            decision = await self.decide(keys, cost, priority)
            wait = next_wait(decision, self.clock(), deadline)
            if wait is None:
                return decision
            await self.sleep(wait)

    async def release(self, lease: str | None) -> bool:
        """Hand back the concurrency slot a decision's `lease` holds. True when it was freed;
        False when there was nothing to free (no lease, released already, run out, or the
        server's store was down: the slot then comes back when its lease runs out)."""
        if lease is None:
            return False
        try:
            await self._post(release_path(lease), {})
        except LimiterAPIError as error:
            if error.status == NOT_HELD:
                return False
            raise
        return True

    def slot(
        self, keys: Mapping[str, str], cost: float = 1, priority: str | None = None, timeout: float | None = None
    ) -> AsyncSlot:
        """`async with client.slot(keys) as decision:` decide (with a `timeout`, acquire):
        RateLimited when denied; on exit, whatever the block did, the decision's concurrency
        slot (if it took one) is released."""
        return AsyncSlot(self, keys, cost, priority, timeout)

    # Reservations ---------------------------------------------------------------------------

    def reserve(
        self, keys: Mapping[str, str], cost: float = 1, priority: str | None = None, hold: float | None = None
    ) -> ReservationRequest:
        """Reserve an estimated cost (and any concurrency slots) until settled or `hold`
        seconds pass (the server's default when None). `async with client.reserve(...) as r`
        settles on leaving the block; `await client.reserve(...)` gives the reservation to
        settle by hand. Either raises RateLimited when denied."""
        return ReservationRequest(self, reservation_body(keys, cost, priority, hold), cost)

    async def make_reservation(self, body: dict, cost: float) -> AsyncRemoteReservation:
        """POST a reservation, shielded: a reservation made for a caller cancelled meanwhile
        is cancelled as soon as its answer arrives."""
        request = self.shielded(self._post("/reservations", body))
        try:
            status, data = await asyncio.shield(request)
        except asyncio.CancelledError:
            request.add_done_callback(lambda done: self._undo(done, cost))
            raise
        reservation = AsyncRemoteReservation(self, data, cost, status)
        if not reservation.allowed:
            raise RateLimited(reservation.decision)
        return reservation

    def _undo(self, done: asyncio.Task, cost: float) -> None:
        """Cancel the reservation that `done` made for nobody."""
        if done.cancelled() or done.exception() is not None:
            return
        status, data = done.result()
        try:
            reservation = AsyncRemoteReservation(self, data, cost, status)
        except LimiterAPIError:
            return
        if reservation.allowed and not reservation.settled:
            self.shielded(reservation.cancel())

    # Tasks that outlive their caller --------------------------------------------------------

    def shielded(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """`work` in a task of its own, which a cancelled caller does not cancel: await it
        through asyncio.shield. aclose() waits for it; a failure no caller saw is logged."""
        self._check_loop()
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("limiter client: %r failed after its caller was gone: %s", task, task.exception())

    # HTTP -----------------------------------------------------------------------------------

    async def _post(self, path: str, body: dict) -> tuple[int, Any]:
        """POST JSON; (status, parsed JSON) of a 2xx answer, else LimiterAPIError;
        LimiterUnavailable when there is no answer within `timeout`."""
        payload = encode(body)
        request = (
            f"POST {self.endpoint.prefix}{path} HTTP/1.1\r\n{self._head}Content-Length: {len(payload)}\r\n\r\n"
        ).encode("latin-1") + payload
        try:
            async with asyncio.timeout(self.timeout):
                status, reason, raw = await self._send(request)
        except TimeoutError:
            raise LimiterUnavailable(f"{self.base_url}: no answer within {self.timeout:g} s") from None
        return status, read_answer(status, reason, raw)

    async def _send(self, request: bytes) -> tuple[int, str, bytes]:
        self._check_loop()
        async with self._slots:
            for attempt in (1, 2):
                connection = self._idle_connection()
                reused = connection is not None
                if connection is None:
                    connection = await self._open()
                done = False
                try:
                    answer = await connection.exchange(request)
                    done = True
                except STALE as error:
                    if reused and attempt == 1 and not connection.answered and not getattr(error, "partial", b""):
                        continue
                    raise LimiterUnavailable(f"{self.base_url}: connection lost: {error!r}") from error
                except (OSError, BadAnswer, asyncio.LimitOverrunError) as error:
                    raise LimiterUnavailable(f"{self.base_url}: no answer: {error!r}") from error
                finally:
                    # A connection whose answer was not read to its end (an error, a timeout,
                    # a cancelled caller) is in no state to carry another request.
                    if done and connection.reusable:
                        self._idle.append(connection)
                    else:
                        connection.close()
                return answer
        raise AssertionError("unreachable")

    def _idle_connection(self) -> Connection | None:
        """The most recently used idle connection that the server has not closed."""
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed_by_server():
                return connection
            connection.close()
        return None

    async def _open(self) -> Connection:
        endpoint = self.endpoint
        tls = None
        if endpoint.https:
            if self._tls is None:  # reading the system's CA certificates blocks: off the loop
                self._tls = await asyncio.get_running_loop().run_in_executor(None, ssl.create_default_context)
            tls = self._tls
        try:
            reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port, ssl=tls)
        except OSError as error:
            raise LimiterUnavailable(f"{self.base_url}: cannot connect: {error!r}") from error
        self.connections_opened += 1
        return Connection(reader, writer)

    def _check_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError(
                "an AsyncLimiterClient belongs to the event loop it was first used on "
                "(its connections are that loop's): make one client per loop"
            )

    async def aclose(self) -> None:
        """Wait (up to `timeout`) for the settlements still in flight, then close the idle
        connections; the client opens new ones if used again, on the same loop."""
        loop = asyncio.get_running_loop()  # its time, not `clock`: a test's clock may stand still
        deadline = loop.time() + self.timeout
        while self._background and loop.time() < deadline:
            await asyncio.wait(set(self._background), timeout=deadline - loop.time())
        while self._idle:
            self._idle.pop().close()

    async def __aenter__(self) -> AsyncLimiterClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<AsyncLimiterClient {self.base_url}>"


class AsyncRemoteReservation(ReservationAnswer):
    """A cost held by the API's server until settled: LimiterClient's RemoteReservation,
    awaited. As an async context manager it commits on a clean exit (with `actual_cost` if
    set, else the reserved `cost`) and cancels on any exception, CancelledError included.
    `id` is None when a fail mode allowed without a reservation: settling does nothing."""

    def __init__(self, client: AsyncLimiterClient, body: Any, cost: float, status: int) -> None:
        super().__init__(body, cost, status)
        self.client = client

    async def commit(self, actual_cost: float | None = None) -> dict | None:
        """Settle with the actual cost (default: `actual_cost`, else the reserved cost):
        the excess is refunded, a shortfall charged, concurrency slots released."""
        return await self._settle("commit", self.commit_body(actual_cost))

    async def cancel(self) -> dict | None:
        """Refund everything and release the slots."""
        return await self._settle("cancel", {})

    async def _settle(self, action: str, body: dict) -> dict | None:
        if self.id is None:
            return None
        try:
            self.settlement = (await self.client._post(settle_path(self.id, action), body))[1]
        except LimiterAPIError as error:
            self.settle_failed(error)
            raise
        self.settled = True
        return self.settlement

    async def __aenter__(self) -> AsyncRemoteReservation:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> Literal[False]:
        if self.settled:
            return False
        if exc is None:
            await asyncio.shield(self.client.shielded(self.commit()))
            return False
        # Any BaseException: a CancelledError (the caller went away) above all. The cancel
        # runs shielded, so cancelling this task again does not cut it short.
        try:
            await asyncio.shield(self.client.shielded(self.cancel()))
        except LimiterError as error:  # the block's exception is the one to see
            exc.add_note(f"cancelling reservation {self.id} failed too: {error}")
        return False  # and the block's exception goes on


class ReservationRequest:
    """What `client.reserve()` gives: awaited, the reservation; in `async with`, the
    reservation for the block, settled on leaving it. Used once."""

    def __init__(self, client: AsyncLimiterClient, body: dict, cost: float) -> None:
        self.client, self.body, self.cost = client, body, cost
        self.reservation: AsyncRemoteReservation | None = None
        self.sent = False

    async def make(self) -> AsyncRemoteReservation:
        if self.sent:
            raise RuntimeError("a reserve() is used once: call client.reserve() again for another reservation")
        self.sent = True
        self.reservation = await self.client.make_reservation(self.body, self.cost)
        return self.reservation

    def __await__(self) -> Generator[Any, None, AsyncRemoteReservation]:
        return self.make().__await__()

    async def __aenter__(self) -> AsyncRemoteReservation:
        return await self.make()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> Literal[False]:
        assert self.reservation is not None  # __aenter__ made it, or raised
        return await self.reservation.__aexit__(exc_type, exc, traceback)


class AsyncSlot:
    """An allowed decision held for an `async with` block: its concurrency slot, if it took
    one, is released on exit (`released`: whether the server freed one), also when the block
    was cancelled; a slot taken for a caller cancelled before the answer came is released
    when it comes."""

    def __init__(
        self,
        client: AsyncLimiterClient,
        keys: Mapping[str, str],
        cost: float,
        priority: str | None,
        timeout: float | None,
    ) -> None:
        self.client, self.keys, self.cost, self.priority, self.timeout = client, keys, cost, priority, timeout
        self.decision: Decision | None = None
        self.released = False

    async def __aenter__(self) -> Decision:
        client = self.client
        if self.timeout is None:
            asking = client.shielded(client.decide(self.keys, self.cost, self.priority))
        else:
            asking = client.shielded(client.acquire(self.keys, self.cost, self.timeout, self.priority))
        try:
            decision = await asyncio.shield(asking)
        except asyncio.CancelledError:
            asking.add_done_callback(self._undo)
            raise
        if not decision.allowed:
            raise RateLimited(decision)
        self.decision = decision
        return decision

    def _undo(self, done: asyncio.Task) -> None:
        if not done.cancelled() and done.exception() is None and done.result().lease is not None:
            self.client.shielded(self.client.release(done.result().lease))

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> Literal[False]:
        assert self.decision is not None
        if self.decision.lease is None:
            return False
        try:
            self.released = await asyncio.shield(self.client.shielded(self.client.release(self.decision.lease)))
        except LimiterError as error:
            if exc is None:
                raise
            exc.add_note(f"releasing lease {self.decision.lease} failed too: {error}")  # the block's error first
        return False
