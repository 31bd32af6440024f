"""Denial statistics: who is throttled right now, and by which rule.

    stats = DenialStats(client=redis_client)   # shared by every worker; DenialStats() for one process
    stats.record(keys, limiter.acquire(keys))  # in process: no I/O, no round trip added to a decision
    stats.report(window=300)                   # denials by blocked_by, top keys per level, a series

Counts go into per-minute buckets: decisions, denials, denials by `blocked_by`, and the denied
keys of each level (the level is the part of `blocked_by` before ": "). `record()` adds to a
buffer in this process; a daemon thread pushes it every `flush_every` seconds in one MULTI/EXEC,
so the counts of every worker that shares the Redis add up. Denied keys are also added up per
hour, so that a 24 h report reads 24 hourly sets per level rather than 1,440 minute sets (26 ms
rather than 760 ms when every set is full). Every Redis key expires once no window can read it,
so memory is bounded by `retention`: per minute one hash (a field per rule that denied, bounded
by the policy), and per minute and per hour one sorted set per level of at most `top_k` keys.
The worst case, every minute with more than top_k denied keys at every level, is about 12 KB per
level and minute (the sets outgrow Redis's compact encoding): 55 MB for three levels over 25 h
at top_k=100.

Top keys are approximate once a level has more than `top_k` denied keys in a bucket (a minute,
or an hour). A trim (Redis after each flush, or a worker's buffer once it holds BUFFER_SLACK x
top_k keys of a level) cuts a key only when top_k others have at least as many denials in that
bucket, so a count is never too high, and a cut loses at most 1/(top_k + 1) of the level's
denials in that bucket. A bucket with at most top_k denied keys at a level is exact, and so is a
key that stays in its buckets' top_k. A key whose denials are spread thinly is low by up to
1/(top_k + 1) of a bucket's denials per cut, and may be missing from a long window's list while
a key with fewer denials in all is listed. Totals and `blocked_by` are exact (at least once: a
flush whose reply is lost after Redis ran it is sent again).

Buckets are minutes of this process's `clock` (wall time), so workers with skewed clocks put a
denial in a neighbouring minute. All keys share the `{stats}` hash tag, so a flush is one
MULTI/EXEC on one node; on Redis Cluster that is one slot for all statistics (a later issue).
"""

from __future__ import annotations

import heapq
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from .errors import ConfigError, InvalidRequest, StoreUnavailable

MINUTE, HOUR = 60, 3600
# A worker trims a level's keys in one buffered minute to top_k once it holds this many times
# top_k: the buffer stays bounded between flushes and while Redis is down, whatever the traffic.
BUFFER_SLACK = 10
# While Redis is down a worker keeps this many minutes of counts and sends them when it is back:
# an outage's "store unavailable" denials are what an operator wants to see afterwards.
KEPT_MINUTES = 15
# Keys outlive the last window that can read them by this much (clock skew between workers).
TTL_SLACK = 60
# blocked_by names are bounded by the policy; this only guards against a caller's own names.
LEVEL_CACHE_SIZE = 10_000
DECISIONS, DENIED, BY = "decisions", "denied", "by:"

log = logging.getLogger(__name__)
_live: weakref.WeakSet[DenialStats] = weakref.WeakSet()


class MinuteCounts:
    """One minute's counts: decisions, denials, denials by blocked_by, denied keys by level."""

    __slots__ = ("decisions", "denied", "blocked", "keys")

    def __init__(self) -> None:
        self.decisions = self.denied = 0
        self.blocked: dict[str, int] = {}
        self.keys: dict[str, dict[str, int]] = {}

    def add(self, other: MinuteCounts, cap: int, top_k: int) -> None:
        """Add `other` in; a level holding more than `cap` keys is trimmed to `top_k`."""
        self.decisions += other.decisions
        self.denied += other.denied
        _add(self.blocked, other.blocked)
        for level, counts in other.keys.items():
            mine = _add(self.keys.setdefault(level, {}), counts)
            if len(mine) > cap:
                self.keys[level] = _top(mine, top_k)


class DenialStats:
    """Decisions, denials by blocked_by and the most denied keys per level, per minute.
    `client` is a redis-py client shared by every worker, or None for this process alone."""

    def __init__(
        self,
        client: Any = None,
        prefix: str = "la",
        clock: Callable[[], float] = time.time,
        flush_every: float | None = 1.0,
        top_k: int = 100,
        retention: float = 25 * 3600,
    ) -> None:
        _check_options(top_k, retention, flush_every)
        self.client, self.prefix, self.clock = client, prefix, clock
        self.flush_every, self.top_k, self.retention = flush_every, top_k, retention
        self._buffer_cap = BUFFER_SLACK * top_k
        self._store_errors = _redis_errors() if client is not None else ()
        # Without a client, what was flushed: minutes, and each hour's keys by level.
        self._minutes: dict[int, MinuteCounts] = {}
        self._hours: dict[int, dict[str, dict[str, int]]] = {}
        self._levels: set[str] = set()  # levels known to have top-key sets in Redis
        self._level_of: dict[str, str] = {}  # blocked_by -> its level, worked out once
        self._last_flush = clock()
        self._failing = False
        self.failed_records = 0  # records that raised (a bug), so not counted
        self.dropped_minutes = 0  # minutes of counts given up during a long Redis outage
        self._start_afresh()
        _live.add(self)

    def _start_afresh(self) -> None:
        """New locks, an empty buffer, no flushing thread: at start and in a forked child
        (the parent flushes what it had buffered; a lock held at fork would never open)."""
        self._lock = threading.Lock()  # the buffer, held by record() for a few dict updates
        self._flush_lock = threading.Lock()  # one flush or in-process read at a time
        self._thread_lock = threading.Lock()
        self._buffer: dict[int, MinuteCounts] = {}
        self._forget_current()
        self._unsent: dict[int, MinuteCounts] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def record(self, keys: Mapping[str, str], decision: Any) -> None:
        """Count one decision, and for a denial its blocked_by and the key at the blocking
        level. In process and thread-safe; never raises, never does I/O."""
        lock = self._lock
        try:
            now = self.clock()
            lock.acquire()  # not `with`: half the cost, and this runs on every decision
            try:
                if self._since <= now < self._until:
                    counts = self._current
                else:
                    counts = self._counts_at(now)
                counts.decisions += 1
                if not decision.allowed:
                    self._count_denial(counts, keys, decision.blocked_by)
            finally:
                lock.release()
        except Exception:  # statistics must never break the decision they describe
            self.failed_records += 1
        if self._thread is None and self.flush_every:
            self._start_flushing()

    def _counts_at(self, now: float) -> MinuteCounts:
        """The buffered minute of `now`, remembered as the current one (called locked)."""
        minute = _minute_of(now)
        counts = self._buffer.get(minute)
        if counts is None:
            counts = self._buffer[minute] = MinuteCounts()
        self._current, self._since, self._until = counts, minute, minute + MINUTE
        return counts

    def _forget_current(self) -> None:
        self._current: MinuteCounts | None = None
        self._since, self._until = math.inf, -math.inf

    def _count_denial(self, counts: MinuteCounts, keys: Mapping[str, str], blocked_by: str | None) -> None:
        counts.denied += 1
        if blocked_by is None:
            return
        counts.blocked[blocked_by] = counts.blocked.get(blocked_by, 0) + 1
        level = self._level_of.get(blocked_by)
        if level is None:
            if len(self._level_of) >= LEVEL_CACHE_SIZE:
                self._level_of.clear()
            level = self._level_of[blocked_by] = _level(blocked_by)
        key = keys.get(level)
        if key is None:
            return
        by_key = counts.keys.get(level)
        if by_key is None:
            by_key = counts.keys[level] = {}
        by_key[key] = by_key.get(key, 0) + 1
        if len(by_key) >= self._buffer_cap:
            counts.keys[level] = _top(by_key, self.top_k)

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
        """Push the buffered counts: one MULTI/EXEC to Redis, or into this process's minutes.
        While Redis is down the counts are kept (bounded) for the next flush; never raises."""
        try:
            self._flush()
        except StoreUnavailable:
            pass  # kept for the next flush; report() is where an outage is told
        except Exception:
            log.exception("denial statistics: flush failed")

    def close(self) -> None:
        """Stop the flushing thread and flush what is left."""
        self.flush_every = None
        self._stop.set()
        self.flush()

    def report(self, window: float, top: int = 10, step: float | None = None) -> dict:
        """Denials over the last `window` seconds, in whole minutes: `since` is the start of
        the first minute read, so a denial up to a minute older than the window may count.
        `step` (a multiple of 60 s) groups the series. Raises InvalidRequest for a bad
        argument and StoreUnavailable when Redis cannot be reached."""
        window = _check_window(window, self.retention)
        top = _check_whole(top, "top", 1, self.top_k)
        step = MINUTE if step is None else _check_step(step, self.retention)
        self._flush()
        now = self.clock()
        first, last = _minute_of(now - window), _minute_of(now)
        read = self._read_redis if self.client is not None else self._read_here
        totals, keys = read(range(first, last + MINUTE, MINUTE), *_key_spans(first, last))
        return {
            "window": window,
            "since": first,
            "until": now,
            **_summary(totals, keys, top),
            "series": _series(totals, first, last, step),
        }

    # --- flushing ------------------------------------------------------------------------------

    def _flush(self) -> None:
        with self._flush_lock:
            now = self.clock()
            with self._lock:
                buffer, self._buffer = self._buffer, {}
                self._forget_current()
                self._last_flush = now
            for minute, counts in buffer.items():
                _merge(self._unsent, minute, counts, self._buffer_cap, self.top_k)
            if not self._unsent:
                return
            if self.client is None:
                self._keep_here(now)
            else:
                self._send(now)
            self._unsent = {}

    def _keep_here(self, now: float) -> None:
        """Without Redis: add the flushed minutes to this process's own, trimmed as Redis
        would trim them, and forget buckets no window can read any more."""
        for minute, counts in self._unsent.items():
            _merge(self._minutes, minute, counts, self.top_k, self.top_k)
        for hour, levels in _by_hour(self._unsent).items():
            mine = self._hours.setdefault(hour, {})
            for level, by_key in levels.items():
                mine[level] = _trimmed(_add(mine.get(level, {}), by_key), self.top_k)
        for buckets, span in ((self._minutes, MINUTE), (self._hours, HOUR)):
            for start in [start for start in buckets if self._ttl(start, span, now) <= 0]:
                del buckets[start]

    def _send(self, now: float) -> None:
        pipe = self.client.pipeline(transaction=True)
        for minute, counts in self._unsent.items():
            ttl = self._ttl(minute, MINUTE, now)
            if ttl > 0:
                self._queue_totals(pipe, minute, counts, ttl)
                for level, by_key in counts.keys.items():
                    self._queue_top(pipe, self._minute_key(minute, level), by_key, ttl)
        for hour, levels in _by_hour(self._unsent).items():
            ttl = self._ttl(hour, HOUR, now)
            if ttl > 0:
                for level, by_key in levels.items():
                    self._queue_top(pipe, self._hour_key(hour, level), by_key, ttl)
        try:
            pipe.execute()
        except self._store_errors as error:
            self._keep_for_later(now, error)
            raise StoreUnavailable(f"Redis cannot take the denial statistics: {error}") from error
        if self._failing:
            self._failing = False
            log.warning("denial statistics: Redis is back, kept counts sent")
        for counts in self._unsent.values():
            self._levels.update(counts.keys)

    def _queue_totals(self, pipe: Any, minute: int, counts: MinuteCounts, ttl: int) -> None:
        totals = self._totals_key(minute)
        pipe.hincrby(totals, DECISIONS, counts.decisions)
        pipe.hincrby(totals, DENIED, counts.denied)
        for blocked_by, n in counts.blocked.items():
            pipe.hincrby(totals, BY + blocked_by, n)
        pipe.expire(totals, ttl)

    def _queue_top(self, pipe: Any, name: str, by_key: Mapping[str, int], ttl: int) -> None:
        """Add to a top-keys set, trim it to top_k, and (re)set its TTL."""
        for key, n in by_key.items():
            pipe.zincrby(name, n, key)
        pipe.zremrangebyrank(name, 0, -self.top_k - 1)
        pipe.expire(name, ttl)

    def _keep_for_later(self, now: float, error: Exception) -> None:
        """Redis is down: keep the newest KEPT_MINUTES minutes, each level at top_k keys."""
        if not self._failing:
            self._failing = True
            log.warning("denial statistics: Redis unreachable, keeping counts: %s", error)
        newest = sorted(self._unsent, reverse=True)
        kept = {m: self._unsent[m] for m in newest[:KEPT_MINUTES] if self._ttl(m, MINUTE, now) > 0}
        self.dropped_minutes += len(self._unsent) - len(kept)
        for counts in kept.values():
            counts.keys = {level: _trimmed(by_key, self.top_k) for level, by_key in counts.keys.items()}
        self._unsent = kept

    def _ttl(self, start: int, span: int, now: float) -> int:
        """Seconds until no window can read the bucket: relative, so that it follows `clock`."""
        return math.ceil(start + span + self.retention + TTL_SLACK - now)

    def _totals_key(self, minute: int) -> str:
        return f"{self.prefix}:{{stats}}:m:{minute}"

    def _minute_key(self, minute: int, level: str) -> str:
        return f"{self.prefix}:{{stats}}:k:{minute}:{level}"

    def _hour_key(self, hour: int, level: str) -> str:
        return f"{self.prefix}:{{stats}}:h:{hour}:{level}"

    # --- reading -------------------------------------------------------------------------------

    def _read_here(self, minutes: range, edge: range, hours: range) -> tuple[dict, dict]:
        with self._flush_lock:
            totals = {m: _totals_only(self._minutes[m]) for m in minutes if m in self._minutes}
            sets = [self._minutes[m].keys for m in edge if m in self._minutes]
            sets += [self._hours[h] for h in hours if h in self._hours]
            keys: dict[str, dict[str, int]] = {}
            for levels in sets:
                for level, by_key in levels.items():
                    _add(keys.setdefault(level, {}), by_key)
        return totals, keys

    def _read_redis(self, minutes: range, edge: range, hours: range) -> tuple[dict, dict]:
        """Every minute's totals and the known levels' top keys in one round trip; a second
        only for levels another worker denied at and this one has not seen yet."""
        known = sorted(self._levels)
        sets = self._top_sets(edge, hours, known)
        replies = self._execute([self._totals_key(m) for m in minutes], [name for _, name in sets])
        totals = {m: _totals_from(hash_) for m, hash_ in zip(minutes, replies) if hash_}
        keys: dict[str, dict[str, int]] = {}
        _add_tops(keys, sets, replies[len(minutes) :])
        new = sorted({_level(name) for c in totals.values() for name in c.blocked} - self._levels)
        if new:
            sets = self._top_sets(edge, hours, new)
            _add_tops(keys, sets, self._execute([], [name for _, name in sets]))
            self._levels.update(new)
        return totals, keys

    def _top_sets(self, edge: range, hours: range, levels: list[str]) -> list[tuple[str, str]]:
        """(level, set name) of the minutes at the window's edge and of its whole hours."""
        return [
            (level, name)
            for level in levels
            for name in [*(self._minute_key(m, level) for m in edge), *(self._hour_key(h, level) for h in hours)]
        ]

    def _execute(self, hashes: list[str], sets: list[str]) -> list:
        pipe = self.client.pipeline(transaction=False)
        for name in hashes:
            pipe.hgetall(name)
        for name in sets:
            pipe.zrange(name, 0, -1, withscores=True)
        try:
            return pipe.execute()
        except self._store_errors as error:
            raise StoreUnavailable(f"Redis cannot read the denial statistics: {error}") from error


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


# --- counting helpers -------------------------------------------------------------------------


def _add(into: dict[str, int], counts: Mapping[str, int]) -> dict[str, int]:
    for name, n in counts.items():
        into[name] = into.get(name, 0) + n
    return into


def _top(counts: Mapping[str, int], k: int) -> dict[str, int]:
    """The k largest counts; ties keep the greater key, as Redis's rank order does."""
    return dict(heapq.nlargest(k, counts.items(), key=lambda item: (item[1], item[0])))


def _merge(into: dict[int, MinuteCounts], minute: int, counts: MinuteCounts, cap: int, top_k: int) -> None:
    into.setdefault(minute, MinuteCounts()).add(counts, cap, top_k)


def _trimmed(counts: dict[str, int], k: int) -> dict[str, int]:
    return counts if len(counts) <= k else _top(counts, k)


def _by_hour(minutes: Mapping[int, MinuteCounts]) -> dict[int, dict[str, dict[str, int]]]:
    """The denied keys of each level, added up by hour."""
    hours: dict[int, dict[str, dict[str, int]]] = {}
    for minute, counts in minutes.items():
        levels = hours.setdefault(minute - minute % HOUR, {})
        for level, by_key in counts.keys.items():
            _add(levels.setdefault(level, {}), by_key)
    return hours


def _minute_of(t: float) -> int:
    return int(t // MINUTE) * MINUTE


def _level(blocked_by: str) -> str:
    return blocked_by.partition(": ")[0]


def _key_spans(first: int, last: int) -> tuple[range, range]:
    """Where a window's top keys are read: minute sets from `first` up to its first whole
    hour, and hourly sets from there to `last` (the current hour holds nothing after now)."""
    first_hour = first if first % HOUR == 0 else first - first % HOUR + HOUR
    return range(first, min(first_hour, last + MINUTE), MINUTE), range(first_hour, last + 1, HOUR)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _totals_only(counts: MinuteCounts) -> MinuteCounts:
    copy = MinuteCounts()
    copy.decisions, copy.denied, copy.blocked = counts.decisions, counts.denied, dict(counts.blocked)
    return copy


def _totals_from(hash_: Mapping) -> MinuteCounts:
    counts = MinuteCounts()
    for field, value in hash_.items():
        field, n = _text(field), int(value)
        if field == DECISIONS:
            counts.decisions = n
        elif field == DENIED:
            counts.denied = n
        elif field.startswith(BY):
            counts.blocked[field[len(BY) :]] = n
    return counts


def _add_tops(keys: dict[str, dict[str, int]], sets: list[tuple[str, str]], replies: list) -> None:
    """Add ZRANGE replies, in the order of `sets`, to each level's key counts."""
    for (level, _), members in zip(sets, replies):
        if members:
            _add(keys.setdefault(level, {}), {_text(key): int(score) for key, score in members})


# --- the report's shape -----------------------------------------------------------------------


def _summary(totals: Mapping[int, MinuteCounts], keys: Mapping[str, Mapping[str, int]], top: int) -> dict:
    blocked: dict[str, int] = {}
    for counts in totals.values():
        _add(blocked, counts.blocked)
    return {
        "decisions": sum(counts.decisions for counts in totals.values()),
        "denied": sum(counts.denied for counts in totals.values()),
        "blocked_by": [
            {"blocked_by": name, "level": _level(name), "denied": n}
            for name, n in sorted(blocked.items(), key=_most_first)
        ],
        "top_keys": {
            level: [{"key": key, "denied": n} for key, n in sorted(by_key.items(), key=_most_first)[:top]]
            for level, by_key in sorted(keys.items())
        },
    }


def _series(totals: Mapping[int, MinuteCounts], first: int, last: int, step: int) -> list[dict]:
    """One point per `step` (aligned to multiples of it) from `first` to `last`, zeros included."""
    points = {
        at: {"at": at, "decisions": 0, "denied": 0, "blocked_by": {}}
        for at in range(first - first % step, last + 1, step)
    }
    for minute, counts in totals.items():
        point = points[minute - minute % step]
        point["decisions"] += counts.decisions
        point["denied"] += counts.denied
        _add(point["blocked_by"], counts.blocked)
    return list(points.values())


def _most_first(item: tuple[str, int]) -> tuple[int, str]:
    return -item[1], item[0]


# --- checks -----------------------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_window(window: Any, retention: float) -> float:
    if not _is_number(window) or not 0 < window <= retention:  # also refuses NaN
        raise InvalidRequest(f"must be seconds, more than 0 and at most {retention:g}, got {window!r}", "window")
    return window


def _check_step(step: Any, retention: float) -> int:
    if not _is_number(step) or not MINUTE <= step <= retention or step % MINUTE:
        raise InvalidRequest(f"must be a whole number of minutes in seconds (60, 900, ...), got {step!r}", "step")
    return int(step)


def _check_whole(value: Any, name: str, least: int, most: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= most:
        raise InvalidRequest(f"must be a whole number from {least} to {most}, got {value!r}", name)
    return value


def _check_options(top_k: Any, retention: Any, flush_every: Any) -> None:
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise ConfigError(f"must be a whole number of at least 1, got {top_k!r}", "top_k")
    if not _is_number(retention) or not MINUTE <= retention < math.inf:
        raise ConfigError(f"must be at least {MINUTE} seconds, got {retention!r}", "retention")
    if flush_every is not None and (not _is_number(flush_every) or not 0 < flush_every < math.inf):
        raise ConfigError(f"must be seconds, more than 0, or None, got {flush_every!r}", "flush_every")


def _redis_errors() -> tuple[type[Exception], ...]:
    from redis.exceptions import RedisError  # here, so that in-process statistics need no redis-py

    return (RedisError,)


__all__ = ["DenialStats", "MinuteCounts"]
