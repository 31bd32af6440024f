"""The decision record: a bounded log of recent decision requests, kept so that they can be
replayed under another policy (core.replay).

    recorder = DecisionRecorder(client=redis_client, limit=200_000)  # DecisionRecorder() keeps them in process
    recorder.decision(keys, cost, priority, decision)                # an append: no I/O, no lock
    recorder.records(since, until)                                   # what was kept, oldest first

Every call that decides (or settles, or hands back a slot) records itself once, through one of
`decision`, `reservation`, `settlement` and `release`. They append a tuple to a buffer in this
process; the process's flushing thread (core/flusher.py) writes the buffer out every
`flush_every` seconds, off the decision's path, and at once when it is half full. With a
Redis client the records go to one stream, `<prefix>:{records}`, each with `XADD ... MAXLEN ~
limit` (Redis trims whole nodes of 100 entries, so slightly more than `limit` may stay);
without one, to a deque of `limit` records in this process.

What is kept when traffic outruns the limit: the most recent `limit` records. The buffer
itself holds at most `limit` records too, so a burst between two flushes drops its oldest,
which trimming would have cut anyway. While Redis cannot be reached a flush drops what it
held (`lost` counts them; the flusher's DROP): records are lost, decisions never wait or
fail for them.

A record in the stream is its request's keys under their level names, and fields whose
names no level may have (level names are letters, digits and `_ . : -`):

    @t  time, whole milliseconds of the recording process's clock (epoch)
    @c  cost (a settlement's: the actual cost, "" for a cancel)
    @p  priority class, "" for none
    @o  outcome: "" allowed, "!<blocked_by>" denied ("!" alone: denied by no rule)
    @l  the concurrency lease a decision took, when it took one
    @r  @h  a reservation's id and the hold it asked for ("" for the default)
    @s  a settlement's reservation id
    @x  a released lease
    @v  what made a decision, when not the decision API: "embedded" (a Django app's own
        views, policies.embedding)

Entries whose field names are those of the stream node's first entry store only their
values, so a plain decision of three levels takes about 47 bytes of Redis and a denial
about 35 more (its blocked_by); docs/OPERATIONS.md has the measured figures.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from redis.exceptions import ConnectionError, TimeoutError

from .errors import ConfigError, StoreUnavailable
from .flusher import DROP, Flushable, Flusher

DEFAULT_LIMIT = 200_000
# Records are read from Redis this many at a time.
PAGE = 10_000
# The stream's entry ids are Redis's clock at the flush, a record's time the recording
# process's at the decision: a read starts this much before the window to allow for skew
# and for records that waited in a buffer.
READ_SLACK_MS = 120_000

# Kinds of record.
DECISION, RESERVATION, SETTLEMENT, RELEASE = "decision", "reservation", "settlement", "release"

_TIME, _COST, _PRIORITY, _OUTCOME = "@t", "@c", "@p", "@o"
_LEASE, _RESERVATION, _HOLD, _SETTLED, _RELEASED, _VIA = "@l", "@r", "@h", "@s", "@x", "@v"
_OWN_FIELDS = {_TIME, _COST, _PRIORITY, _OUTCOME, _LEASE, _RESERVATION, _HOLD, _SETTLED, _RELEASED, _VIA}
# What the Redis log turns into StoreUnavailable: the server could not be reached in time.
_UNREACHABLE = (ConnectionError, TimeoutError, OSError)


class Record(NamedTuple):
    """One recorded request. `time`: epoch seconds. `cost`: what it asked to take (a
    settlement's actual cost; None for a cancel). `ref`: a reservation's id (reservations and
    settlements) or a concurrency lease (a decision that took one, a release). `hold`: the
    hold a reservation asked for (None: the default)."""

    time: float
    kind: str
    keys: Mapping[str, str]
    cost: float | None = 1
    priority: str | None = None
    allowed: bool = True
    blocked_by: str | None = None
    ref: str | None = None
    hold: float | None = None
    via: str | None = None


def check_limit(limit: Any) -> int:
    """The number of records to keep: a whole number, 0 (recording off) or more."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ConfigError(f"must be a whole number of records, 0 (off) or more, got {limit!r}", "limit")
    return limit


class DecisionRecorder(Flushable):
    """Records decision requests from every worker into one bounded log. `client`: a
    redis-py client (or cluster client) shared by every worker; None keeps the log in this
    process. `clock`: epoch seconds, the time a record carries. `lost`: records a failed
    flush dropped. `url`: the URL of `client`'s Redis, when another process (a replay of its
    own) may read the record from there: `stream()` names it."""

    on_store_error = DROP
    what = "decision record"

    def __init__(
        self,
        client: Any = None,
        limit: int = DEFAULT_LIMIT,
        prefix: str = "la",
        clock: Callable[[], float] = time.time,
        flush_every: float | None = 1.0,
        flusher: Flusher | None = None,
        url: str | None = None,
    ) -> None:
        self.limit = check_limit(limit)
        self.url = url if client is not None else None
        if self.limit == 0:
            raise ConfigError("a recorder keeps at least one record (0 means: make none)", "limit")
        self.clock = clock
        self.log: RedisLog | MemoryLog = (
            MemoryLog(self.limit) if client is None else RedisLog(client, f"{prefix}:{{records}}", self.limit)
        )
        self.shared = client is not None
        self._buffer: deque[tuple] = deque(maxlen=self.limit)
        # Half full, the buffer wakes the flusher: past the limit it would drop its oldest.
        self._wake_at = max(1, self.limit // 2)
        super().__init__(flush_every, flusher)

    def after_fork(self) -> None:
        self._buffer = deque(maxlen=self.limit)
        super().after_fork()

    def stream(self) -> tuple[str, str] | None:
        """(url, key) where another process reads every worker's records, once this process's
        buffer is written out; None when the record is this process's alone, or its URL is
        not known."""
        if self.url is None or not isinstance(self.log, RedisLog):
            return None
        self.flush()
        return self.url, self.log.key

    # --- recording (on the decision's path: one append) ------------------------------------------

    def decision(
        self, keys: Mapping[str, str], cost: float, priority: str | None, decision: Any, via: str | None = None
    ) -> None:
        """A decision made (`decision`: a core.Decision, or anything with `allowed`,
        `blocked_by` and `lease`); `via`: what made it, when not the decision API."""
        self._append((DECISION, self.clock(), keys, cost, priority, decision, None, None, via))

    def reservation(
        self,
        keys: Mapping[str, str],
        cost: float,
        priority: str | None,
        hold: float | None,
        decision: Any,
        reservation_id: str | None,
    ) -> None:
        """A reservation asked for with an estimated `cost` and `hold`; `reservation_id` is
        None when nothing was reserved (a denial, or a fail mode's decision)."""
        self._append((RESERVATION, self.clock(), keys, cost, priority, decision, reservation_id, hold, None))

    def settlement(self, reservation_id: str, actual_cost: float | None) -> None:
        """A reservation settled: committed with `actual_cost`, or cancelled (None)."""
        self._append((SETTLEMENT, self.clock(), {}, actual_cost, None, None, reservation_id, None, None))

    def release(self, keys: Mapping[str, str], lease: str) -> None:
        """A concurrency lease handed back before it ran out."""
        self._append((RELEASE, self.clock(), keys, None, None, None, lease, None, None))

    def _append(self, item: tuple) -> None:
        buffer = self._buffer
        buffer.append(item)
        flusher = self.flusher
        if flusher.thread is None and self.flush_every:
            flusher.start()  # on first use, so that each forked worker starts its own
        elif len(buffer) >= self._wake_at and self.flush_every:
            flusher.wake()

    # --- flushing (in the flusher's thread, or by hand; see core/flusher.py) ---------------------

    def take(self) -> list[tuple] | None:
        buffer = self._buffer
        # popleft, not a swap of buffers: a decision appending meanwhile is never lost.
        batch = [buffer.popleft() for _ in range(len(buffer))]
        return batch or None

    def write(self, batch: list[tuple]) -> int:
        self.log.write([_record(item) for item in batch])
        return len(batch)

    # --- reading ---------------------------------------------------------------------------------

    def records(self, since: float, until: float) -> list[Record]:
        """The kept records whose time is from `since` to `until` (epoch seconds), oldest
        first, after writing out this process's buffer. Raises StoreUnavailable."""
        self.flush()
        return self.log.read(since, until)


def _record(item: tuple) -> Record:
    """A buffered tuple as a Record (in the flushing thread, off the decision's path)."""
    kind, at, keys, cost, priority, decision, ref, hold, via = item
    if decision is None:
        return Record(at, kind, keys, cost, priority, True, None, ref, hold)
    if kind == DECISION:
        ref = decision.lease
    return Record(at, kind, keys, cost, priority, decision.allowed, decision.blocked_by, ref, hold, via)


class MemoryLog:
    """The records of this process alone, the most recent `limit` of them."""

    def __init__(self, limit: int) -> None:
        self._records: deque[Record] = deque(maxlen=limit)
        self._lock = threading.Lock()

    def write(self, records: Iterable[Record]) -> None:
        with self._lock:
            self._records.extend(records)

    def read(self, since: float, until: float) -> list[Record]:
        with self._lock:
            found = [record for record in self._records if since <= record.time <= until]
        found.sort(key=_time)
        return found

    def __len__(self) -> int:
        return len(self._records)


class RedisLog:
    """The records of every worker in one Redis stream, `XADD ... MAXLEN ~ limit`.

    One key (one hash slot) on a Redis Cluster too: a flush is one pipeline to one node and a
    replay reads one stream in order, at the price of every worker's records going to that
    node (one XADD a record)."""

    def __init__(self, client: Any, key: str, limit: int) -> None:
        self.client, self.key, self.limit = client, key, limit

    def write(self, records: Iterable[Record]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for record in records:
            pipe.xadd(self.key, encode(record), maxlen=self.limit, approximate=True)
        try:
            pipe.execute()
        except _UNREACHABLE as error:
            raise StoreUnavailable(f"Redis cannot take the records: {error}") from error

    def read(self, since: float, until: float) -> list[Record]:
        found: list[Record] = []
        start: Any = max(0, math.floor(since * 1000) - READ_SLACK_MS)
        while True:
            try:
                page = self.client.xrange(self.key, min=start, max="+", count=PAGE)
            except _UNREACHABLE as error:
                raise StoreUnavailable(f"Redis cannot read the records: {error}") from error
            for _, fields in page:
                record = decode(fields)
                if since <= record.time <= until:
                    found.append(record)
            if len(page) < PAGE:
                break
            start = b"(" + _bytes(page[-1][0])
        found.sort(key=_time)
        return found

    def __len__(self) -> int:
        return self.client.xlen(self.key)


def encode(record: Record) -> dict[str, Any]:
    """A record as the fields of its stream entry (the module's docstring lists them)."""
    fields: dict[str, Any] = dict(record.keys)
    fields[_TIME] = round(record.time * 1000)
    if record.kind == SETTLEMENT:
        fields[_COST] = "" if record.cost is None else _int_if_whole(record.cost)
        fields[_SETTLED] = record.ref
        return fields
    if record.kind == RELEASE:
        fields[_RELEASED] = record.ref
        return fields
    assert record.cost is not None, "only a settlement (a cancel) has no cost"
    fields[_COST] = _int_if_whole(record.cost)
    fields[_PRIORITY] = record.priority or ""
    fields[_OUTCOME] = "" if record.allowed else "!" + (record.blocked_by or "")
    if record.kind == RESERVATION:
        fields[_RESERVATION] = record.ref or ""
        fields[_HOLD] = "" if record.hold is None else _int_if_whole(record.hold)
    elif record.ref is not None:
        fields[_LEASE] = record.ref
    if record.via is not None:
        fields[_VIA] = record.via
    return fields


def decode(fields: Mapping[Any, Any]) -> Record:
    """The record of a stream entry's fields (bytes or str)."""
    own, keys = {}, {}
    for name, value in fields.items():
        name, value = _text(name), _text(value)
        if name in _OWN_FIELDS:
            own[name] = value
        else:
            keys[name] = value
    at = int(own[_TIME]) / 1000
    if _SETTLED in own:
        actual = own[_COST]
        return Record(at, SETTLEMENT, {}, float(actual) if actual else None, ref=own[_SETTLED])
    if _RELEASED in own:
        return Record(at, RELEASE, keys, None, ref=own[_RELEASED])
    outcome = own[_OUTCOME]
    allowed = not outcome
    blocked_by = None if allowed or outcome == "!" else outcome[1:]
    cost, priority = float(own[_COST]), own[_PRIORITY] or None
    if _RESERVATION in own:
        hold = own[_HOLD]
        return Record(
            at,
            RESERVATION,
            keys,
            cost,
            priority,
            allowed,
            blocked_by,
            own[_RESERVATION] or None,
            float(hold) if hold else None,
        )
    return Record(at, DECISION, keys, cost, priority, allowed, blocked_by, own.get(_LEASE), via=own.get(_VIA))


def _int_if_whole(value: float) -> int | float:
    """A whole number as an int (Redis keeps a small one in a byte or two)."""
    return int(value) if float(value).is_integer() and abs(value) < 2**63 else value


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _time(record: Record) -> float:
    return record.time


__all__ = ["DEFAULT_LIMIT", "DecisionRecorder", "MemoryLog", "Record", "RedisLog", "check_limit", "decode", "encode"]
