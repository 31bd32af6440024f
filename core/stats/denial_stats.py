"""DenialStats: decisions counted in this process, flushed to the shared store, read back.

`record()` adds to a buffer under a lock (counts.Tally); a daemon thread flushes it every
`flush_every` seconds (flush.StatsWriter) and the reports read what every worker flushed
(reports.StatsReader). While Redis is down the counts are kept, bounded, for the next flush.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from ..decision import Decision
from ..errors import StoreUnavailable
from .checks import check_options, check_report, check_usage
from .counts import MinuteCounts, Tally
from .flush import StatsWriter
from .layout import DAY, HOUR, MINUTE, Bounds, StatsKeys, floor, ttl
from .memory import MemoryStatsStore
from .reports import StatsReader

# While Redis is down a worker keeps this many minutes of counts and sends them when it is back:
# an outage's "store unavailable" denials are what an operator wants to see afterwards.
KEPT_MINUTES = 15
SWEEP_EVERY = 5.0  # seconds of `clock` between two sweeps of expired reservations

log = logging.getLogger("core.stats")
_live: weakref.WeakSet[DenialStats] = weakref.WeakSet()


class DenialStats:
    """Decisions, denials and shadow denials by rule, the most denied tenants and keys, and
    every tenant's traffic over time. `client` is a redis-py client shared by every worker,
    or None for this process alone. `tier_of(tenant)` names the tier a tenant resolves to
    (asked when a flush sends its counts, off the decision's path)."""

    # The minute record() counts into without a lookup, and its start and end.
    _current: MinuteCounts
    _since: float
    _until: float

    def __init__(
        self,
        client: Any = None,
        prefix: str = "la",
        clock: Callable[[], float] = time.time,
        flush_every: float | None = 1.0,
        top_k: int = 100,
        retention: float = 25 * HOUR,
        tenant_level: str = "team",
        user_level: str = "user",
        usage_minutes: float = DAY,
        usage_hours: float = 30 * DAY,
        user_top_k: int = 20,
        tier_of: Callable[[str], str | None] | None = None,
        on_expired: Callable[[int], None] | None = None,
    ) -> None:
        check_options(top_k, retention, flush_every, usage_minutes, usage_hours, user_top_k)
        # The options as given, to read: the parts made below keep their own copies.
        self.shared = client is not None
        self.client = client if client is not None else MemoryStatsStore(clock)
        self.prefix, self.clock = prefix, clock
        self.flush_every, self.top_k, self.retention = flush_every, top_k, retention
        self.tenant_level, self.user_level = tenant_level, user_level
        self.usage_minutes, self.usage_hours, self.user_top_k = usage_minutes, usage_hours, user_top_k
        self.tier_of, self.on_expired = tier_of, on_expired
        self._bounds = Bounds(top_k, user_top_k, retention, usage_minutes, usage_hours)
        self._store_errors = _redis_errors() if self.shared else ()
        self._tally = Tally(tenant_level, user_level, top_k, user_top_k)
        keys = StatsKeys(prefix)
        self._writer = StatsWriter(self.client, keys, self._bounds, tier_of)
        self._reader = StatsReader(self.client, keys, self._bounds, user_level, self._store_errors)
        self._last_flush = clock()
        self._next_sweep = -math.inf
        self._failing = False
        self.failed_records = 0  # records that raised (a bug), so not counted
        self.dropped_minutes = 0  # minutes of counts given up during a long Redis outage
        self.expired_reservations = 0  # counted by this process's sweeps
        self._start_afresh()
        _live.add(self)

    @property
    def untracked_tenants(self) -> int:
        """Decisions of tenants past MAX_TENANTS in a minute (counted in the totals only)."""
        return self._tally.untracked_tenants

    def _start_afresh(self) -> None:
        """New locks, an empty buffer, no flushing thread: at start and in a forked child
        (the parent flushes what it had buffered; a lock held at fork would never open)."""
        self._lock = threading.Lock()  # the buffer, held by record() for a few dict updates
        self._flush_lock = threading.Lock()  # one flush at a time
        self._thread_lock = threading.Lock()
        self._buffer: dict[int, MinuteCounts] = {}
        self._opened: dict[str, float] = {}  # reservation id -> expiry, not sent yet
        self._settled: set[str] = set()
        self._forget_current()
        self._unsent: dict[int, MinuteCounts] = {}
        self._unsent_opened: dict[str, float] = {}
        self._unsent_settled: set[str] = set()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # --- recording (on the decision's path: in process, a few dict updates) -------------------

    def record(self, keys: Mapping[str, str], decision: Decision, cost: float = 1) -> None:
        """Count one decision: for its tenant and user, and for a denial its blocked_by and
        the key at the blocking level; `cost` counts as taken when it was allowed.
        In process and thread-safe; never raises, never does I/O."""
        lock = self._lock
        try:
            now = self.clock()
            lock.acquire()  # not `with`: half the cost, and this runs on every decision
            try:
                counts = self._current if self._since <= now < self._until else self._counts_at(now)
                self._tally.count(counts, keys, decision, cost)
            finally:
                lock.release()
        except Exception:  # statistics must never break the decision they describe
            self.failed_records += 1
        if self._thread is None and self.flush_every:
            self._start_flushing()

    def _counts_at(self, now: float) -> MinuteCounts:
        """The buffered minute of `now`, remembered as the current one (called locked)."""
        minute = floor(now, MINUTE)
        counts = self._buffer.get(minute)
        if counts is None:
            counts = self._buffer[minute] = MinuteCounts()
        self._current, self._since, self._until = counts, minute, minute + MINUTE
        return counts

    def _forget_current(self) -> None:
        # An empty range: record() finds the minute again (the placeholder is never counted into).
        self._current = MinuteCounts()
        self._since, self._until = math.inf, -math.inf

    def reservation_opened(self, reservation_id: str, hold: float) -> None:
        """Remember an open reservation until it is settled; one left open past its
        expiry (and EXPIRY_GRACE) counts as expired, once, in the process that sweeps it."""
        try:
            expires = self.clock() + hold
            with self._lock:
                self._opened[reservation_id] = expires
        except Exception:
            self.failed_records += 1

    def reservation_settled(self, reservation_id: str) -> None:
        """A reservation was committed or cancelled: it will not count as expired."""
        with self._lock:
            if self._opened.pop(reservation_id, None) is None:
                self._settled.add(reservation_id)

    # --- flushing -------------------------------------------------------------------------------

    def _start_flushing(self) -> None:
        # A daemon thread, not record(): a flush is a round trip, and record() runs inside a
        # decision. Started on first use, so each forked worker starts its own.
        with self._thread_lock:
            if self._thread is None and self.flush_every:
                self._thread = threading.Thread(
                    target=_flush_periodically,
                    args=(weakref.ref(self), self._stop, self.flush_every),
                    name="denial-stats-flush",
                    daemon=True,
                )
                self._thread.start()

    def maybe_flush(self) -> None:
        """Flush if `flush_every` seconds of `clock` have passed since the last flush."""
        try:
            due = self.flush_every and self.clock() - self._last_flush >= self.flush_every
        except Exception:
            return
        if due:
            self.flush()

    def flush(self) -> None:
        """Push the buffered counts in one MULTI/EXEC (to Redis, or this process's store).
        While Redis is down the counts are kept (bounded) for the next flush; never raises."""
        try:
            self._flush()
        except StoreUnavailable:
            pass  # kept for the next flush; a read is where an outage is told
        except Exception:
            log.exception("denial statistics: flush failed")

    def close(self) -> None:
        """Stop the flushing thread and flush what is left."""
        self.flush_every = None
        self._stop.set()
        self.flush()

    def _flush(self) -> None:
        with self._flush_lock:
            now = self.clock()
            with self._lock:
                buffer, self._buffer = self._buffer, {}
                opened, self._opened = self._opened, {}
                settled, self._settled = self._settled, set()
                self._forget_current()
                self._last_flush = now
            for minute, counts in buffer.items():
                self._unsent.setdefault(minute, MinuteCounts()).add(counts, self.top_k, self.user_top_k)
            self._unsent_opened.update(opened)
            for reservation_id in settled:
                if self._unsent_opened.pop(reservation_id, None) is None:
                    self._unsent_settled.add(reservation_id)
            if self._unsent or self._unsent_opened or self._unsent_settled:
                self._send(now)
                self._unsent, self._unsent_opened, self._unsent_settled = {}, {}, set()
            if now >= self._next_sweep:
                self._next_sweep = now + SWEEP_EVERY
                self._sweep(now)

    def _send(self, now: float) -> None:
        try:
            self._writer.send(self._unsent, self._unsent_opened, self._unsent_settled, now)
        except self._store_errors as error:
            self._keep_for_later(now, error)
            raise StoreUnavailable(f"Redis cannot take the statistics: {error}") from error
        if self._failing:
            self._failing = False
            log.warning("denial statistics: Redis is back, kept counts sent")
        self._reader.know_levels(level for counts in self._unsent.values() for level in counts.keys)

    def _keep_for_later(self, now: float, error: Exception) -> None:
        """Redis is down: keep the newest KEPT_MINUTES minutes, each bucket at top_k."""
        if not self._failing:
            self._failing = True
            log.warning("denial statistics: Redis unreachable, keeping counts: %s", error)
        newest = sorted(self._unsent, reverse=True)
        kept = {m: self._unsent[m] for m in newest[:KEPT_MINUTES] if ttl(m, MINUTE, now, self.retention) > 0}
        self.dropped_minutes += len(self._unsent) - len(kept)
        for counts in kept.values():
            counts.trim(self.top_k)
        self._unsent = kept

    # The writer's rule ids, reached from here by the tests of their naming.
    def _rule_ids(self, names: set[str]) -> dict[str, str]:
        return self._writer.rule_ids(names)

    def _new_rule_id(self, name: str) -> str:
        return self._writer.new_rule_id(name)

    def _sweep(self, now: float) -> None:
        """Count the reservations left open past their expiry that this process removed."""
        try:
            removed = self._writer.sweep(now)
        except self._store_errors:
            return  # swept at the next flush
        self.expired_reservations += removed
        if removed and self.on_expired is not None:
            try:
                self.on_expired(removed)
            except Exception:
                log.exception("denial statistics: on_expired failed")

    # --- reading (each flushes this process's buffer first) -------------------------------------

    def report(self, window: float, top: int = 10, step: float | None = None) -> dict[str, Any]:
        """Decisions and denials over the last `window` seconds, in whole minutes: `since` is
        the start of the first minute read, so a decision up to a minute older than the
        window may count. `step` (a multiple of 60 s) groups the series. Raises
        InvalidRequest for a bad argument and StoreUnavailable when Redis cannot be reached."""
        window, top, step = check_report(window, top, step, self._bounds)
        self._flush()
        return self._reader.report(window, top, step, self.clock())

    def usage(self, tenant: str, window: float, step: int = MINUTE, top: int = 10) -> dict[str, Any]:
        """One tenant's decisions, allowed, denied, shadow-denied and cost per `step` (60 or
        3600 s) over the last `window` seconds; its blocked_by and shadow rules and most
        throttled users over the whole hours the window touches (`breakdown_since`; users
        over the last `usage_minutes` of them at most). `has_traffic` is false when nothing
        was recorded for it in the window."""
        window, step, top = check_usage(window, step, top, self._bounds)
        self._flush()
        return self._reader.usage(tenant, window, step, top, self.clock())

    def seen_users(self, prefix: str, limit: int = 10) -> list[dict[str, str | None]]:
        """Users seen recently (within `usage_minutes`) whose key starts with `prefix`, most
        recent first: [{"user", "team"}]. Raises StoreUnavailable when Redis is down."""
        self._flush()
        return self._reader.seen_users(prefix, limit)


def _flush_periodically(stats_ref: weakref.ref[DenialStats], stop: threading.Event, every: float) -> None:
    """The flushing thread. It holds its DenialStats weakly, so a dropped one stops it.
    It waits in real seconds (no clock can be waited on); maybe_flush() reads `clock`."""
    while not stop.wait(every):
        stats = stats_ref()
        if stats is None:
            return
        stats.maybe_flush()
        del stats


def _after_fork_in_child() -> None:
    for stats in list(_live):
        stats._start_afresh()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _redis_errors() -> tuple[type[Exception], ...]:
    from redis.exceptions import RedisError  # here, so that in-process statistics need no redis-py

    return (RedisError,)
