"""DenialStats: decisions counted in this process, flushed to the shared store, read back.

`record()` adds to a buffer under a lock (counts.Tally); the process's flushing thread
(core/flusher.py) writes it out every `flush_every` seconds (flush.StatsWriter) and the reports
read what every worker flushed (reports.StatsReader). While Redis is down the counts are kept,
bounded, for the next flush (the flusher's KEEP).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..decision import Decision
from ..flusher import KEEP, STORE_ERRORS, Flushable, Flusher
from .checks import check_options, check_report, check_usage
from .counts import MinuteCounts, Tally
from .flush import StatsWriter, Unsent
from .layout import DAY, HOUR, MINUTE, Bounds, StatsKeys, floor
from .memory import MemoryStatsStore
from .reports import StatsReader

# While Redis is down a worker keeps this many minutes of counts and sends them when it is back:
# an outage's "store unavailable" denials are what an operator wants to see afterwards.
KEPT_MINUTES = 15
SWEEP_EVERY = 5.0  # seconds of `clock` between two sweeps of expired reservations

log = logging.getLogger("core.stats")


class DenialStats(Flushable):
    """Decisions, denials, shadow denials and decisions over a soft quota by rule, the most
    denied tenants and keys, and every tenant's traffic over time. `client` is a redis-py
    client shared by every worker, or None for this process alone. `tier_of(tenant)` names
    the tier a tenant resolves to (asked when a flush sends its counts, off the decision's
    path). `on_flush(tenants)` is told, after each flush that sent counts, the tenants (team
    keys) they were of: in the flushing thread, so it should only take note (alerts are
    evaluated from it)."""

    on_store_error = KEEP
    what = "denial statistics"

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
        on_flush: Callable[[frozenset[str]], None] | None = None,
        flusher: Flusher | None = None,
    ) -> None:
        check_options(top_k, retention, flush_every, usage_minutes, usage_hours, user_top_k)
        # The options as given, to read: the parts made below keep their own copies.
        self.shared = client is not None
        self.client = client if client is not None else MemoryStatsStore(clock)
        self.prefix, self.clock = prefix, clock
        self.top_k, self.retention = top_k, retention
        self.tenant_level, self.user_level = tenant_level, user_level
        self.usage_minutes, self.usage_hours, self.user_top_k = usage_minutes, usage_hours, user_top_k
        self.tier_of, self.on_expired, self.on_flush = tier_of, on_expired, on_flush
        self._bounds = Bounds(top_k, user_top_k, retention, usage_minutes, usage_hours)
        self._store_errors = STORE_ERRORS if self.shared else ()
        self._tally = Tally(tenant_level, user_level, top_k, user_top_k)
        keys = StatsKeys(prefix)
        self._writer = StatsWriter(self.client, keys, self._bounds, tier_of)
        self._reader = StatsReader(self.client, keys, self._bounds, user_level, self._store_errors)
        self._last_flush = clock()
        self._next_sweep = -math.inf
        self.failed_records = 0  # records that raised (a bug), so not counted
        self.dropped_minutes = 0  # minutes of counts given up during a long Redis outage
        self.expired_reservations = 0  # counted by this process's sweeps
        self._start_afresh()
        super().__init__(flush_every, flusher)

    @property
    def untracked_tenants(self) -> int:
        """Decisions of tenants past MAX_TENANTS in a minute (counted in the totals only)."""
        return self._tally.untracked_tenants

    def _start_afresh(self) -> None:
        """A new lock, an empty buffer and nothing kept: at start and in a forked child (the
        parent flushes what it had buffered; a lock held at fork would never open)."""
        self._lock = threading.Lock()  # the buffer, held by record() for a few dict updates
        self._buffer: dict[int, MinuteCounts] = {}
        self._opened: dict[str, float] = {}  # reservation id -> expiry, not sent yet
        self._settled: set[str] = set()
        self._forget_current()
        self._kept = Unsent()  # what flushes could not write while Redis was down

    def after_fork(self) -> None:
        self._start_afresh()
        super().after_fork()

    # --- recording (on the decision's path: in process, a few dict updates) -------------------

    def record(self, keys: Mapping[str, str], decision: Decision, cost: float = 1, embedded: bool = False) -> None:
        """Count one decision: for its tenant and user, and for a denial its blocked_by and
        the key at the blocking level; `cost` counts as taken when it was allowed; `embedded`
        when a Django app made it in its own view. In process and thread-safe; never raises,
        never does I/O."""
        lock = self._lock
        try:
            now = self.clock()
            lock.acquire()  # not `with`: half the cost, and this runs on every decision
            try:
                counts = self._current if self._since <= now < self._until else self._counts_at(now)
                self._tally.count(counts, keys, decision, cost, embedded)
            finally:
                lock.release()
        except Exception:  # statistics must never break the decision they describe
            self.failed_records += 1
        if self.flusher.thread is None and self.flush_every:
            self.flusher.start()  # on first use, so that each forked worker starts its own

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

    # --- flushing (in the flusher's thread, or by hand; see core/flusher.py) -------------------

    def maybe_flush(self) -> None:
        """Flush if `flush_every` seconds of `clock` have passed since the last flush."""
        try:
            due = self.flush_every and self.clock() - self._last_flush >= self.flush_every
        except Exception:
            return
        if due:
            self.flush()

    def take(self) -> Unsent | None:
        """The buffer, added to what earlier flushes kept; None when there is nothing to send
        and no sweep is due."""
        now = self.clock()
        with self._lock:
            buffer, self._buffer = self._buffer, {}
            opened, self._opened = self._opened, {}
            settled, self._settled = self._settled, set()
            self._forget_current()
            self._last_flush = now
        batch, self._kept = self._kept, Unsent()
        batch.add(buffer, opened, settled, self._bounds)
        batch.now, batch.sweep = now, now >= self._next_sweep
        if batch.sweep:
            self._next_sweep = now + SWEEP_EVERY
        return batch if batch or batch.sweep else None

    def write(self, batch: Unsent) -> int:
        """Push the batch in one MULTI/EXEC (to Redis, or this process's store), then sweep."""
        written = len(batch)
        tenants: frozenset[str] = frozenset()
        if batch:
            self._writer.send(batch.minutes, batch.opened, batch.settled, batch.now)
            self._reader.know_levels(level for counts in batch.minutes.values() for level in counts.keys)
            if self.on_flush is not None:
                tenants = frozenset(tenant for counts in batch.minutes.values() for tenant in counts.tenants)
            batch.clear()  # sent: should the sweep fail, nothing of it is kept to be sent twice
        if tenants and self.on_flush is not None:
            try:
                self.on_flush(tenants)
            except Exception:  # the caller's hook: its failure is not the store's
                log.exception("denial statistics: on_flush failed")
        if batch.sweep:
            self._sweep(batch.now)
        return written

    def keep(self, batch: Unsent) -> None:
        """Redis is down: keep the newest KEPT_MINUTES minutes, each bucket at top_k."""
        batch.add(self._kept.minutes, self._kept.opened, self._kept.settled, self._bounds)
        self.dropped_minutes += batch.bound(KEPT_MINUTES, self._bounds, batch.now)
        self._kept = batch

    # The writer's rule ids, reached from here by the tests of their naming.
    def _rule_ids(self, names: set[str]) -> dict[str, str]:
        return self._writer.rule_ids(names)

    def _new_rule_id(self, name: str) -> str:
        return self._writer.new_rule_id(name)

    def _sweep(self, now: float) -> None:
        """Count the reservations left open past their expiry that this process removed."""
        removed = self._writer.sweep(now)
        self.expired_reservations += removed
        if removed and self.on_expired is not None:
            try:
                self.on_expired(removed)
            except Exception:  # the caller's hook: its failure is not the store's
                log.exception("denial statistics: on_expired failed")

    # --- reading (each flushes this process's buffer first) -------------------------------------

    def report(self, window: float, top: int = 10, step: float | None = None) -> dict[str, Any]:
        """Decisions and denials over the last `window` seconds, in whole minutes: `since` is
        the start of the first minute read, so a decision up to a minute older than the
        window may count. `step` (a multiple of 60 s) groups the series. Raises
        InvalidRequest for a bad argument and StoreUnavailable when Redis cannot be reached."""
        window, top, step = check_report(window, top, step, self._bounds)
        self.flush()
        return self._reader.report(window, top, step, self.clock())

    def usage(self, tenant: str, window: float, step: int = MINUTE, top: int = 10) -> dict[str, Any]:
        """One tenant's decisions, allowed, denied, shadow-denied, over a soft quota and cost
        per `step` (60 or 3600 s) over the last `window` seconds; its blocked_by, shadow rules,
        soft quotas gone over and most throttled users over the whole hours the window touches
        (`breakdown_since`; users over the last `usage_minutes` of them at most). `has_traffic` is false when nothing
        was recorded for it in the window."""
        window, step, top = check_usage(window, step, top, self._bounds)
        self.flush()
        return self._reader.usage(tenant, window, step, top, self.clock())

    def denials(self, tenants: Iterable[str], window: float) -> dict[str, tuple[int, int]]:
        """(decisions, denied) of each tenant over the last `window` seconds (at most
        `usage_minutes`), in whole minutes as `usage` counts them: the cheap read of many
        tenants at once (the alerts' denied shares). Raises StoreUnavailable when Redis is down."""
        window = check_usage(window, MINUTE, 1, self._bounds)[0]
        self.flush()
        return self._reader.denials(tenants, window, self.clock())

    def seen_users(self, prefix: str, limit: int = 10) -> list[dict[str, str | None]]:
        """Users seen recently (within `usage_minutes`) whose key starts with `prefix`, most
        recent first: [{"user", "team"}]. Raises StoreUnavailable when Redis is down."""
        self.flush()
        return self._reader.seen_users(prefix, limit)
