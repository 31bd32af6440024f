"""Decision statistics: who is throttled, by which rule, per tenant and over time.

    stats = DenialStats(client=redis_client)        # shared by every worker; DenialStats() for one process
    stats.record(keys, limiter.acquire(keys), cost)  # in process: no I/O, no round trip added to a decision
    stats.report(window=300)                        # denials by blocked_by, top tenants and keys, a series
    stats.usage("acme", window=86400, step=60)      # one tenant's traffic over time

`record()` adds to a buffer in this process; a daemon thread pushes it every `flush_every`
seconds in one MULTI/EXEC, so the counts of every worker that shares the Redis add up.
Without a client the same commands go to a store in this process (core.stats_memory).

Every decision names its tenant (the key at `tenant_level`) and its user (the key at
`user_level`), whichever level blocked it. What is kept, all under the `{stats}` hash tag
(`P` is `<prefix>:{stats}`), each key expiring once no window can read it:

    P:m:<minute>            hash   decisions, denied, shadow (decisions a shadow rule would
                                   have denied), by:<blocked_by>, sh:<shadow rule>
    P:k:<minute>:<level>    zset   the most denied keys of a level (users as [user, team])
    P:h:<hour>:<level>      zset   the same, per hour (a 24 h report reads 24, not 1,440)
    P:t:<minute>, P:ht:<hour> zset the most denied tenants, denials at any level
    P:um:<quarter>:<tenant> hash   the tenant's minutes: <i>d decisions, <i>x denied,
                                   <i>s shadow-denied, <i>c cost taken (i: minute 0-14)
    P:uh:<day>:<tenant>     hash   its hours, the same fields (i: hour 0-23), and t: its tier
    P:ub:<day>:<tenant>     hash   <h>b<rule id> (denials) and <h>s<rule id> (shadow) per hour
    P:rules, P:rule-names   hash   rule name -> short id, and back (every worker's the same)
    P:uu:<hour>:<tenant>, P:ux:<hour>:<tenant>  zset  its most active and most denied users
    P:seen                  zset   recently seen users ([user, team]), score: when
    P:res                   zset   open reservations, score: when they expire

A tenant's minutes live in one hash per quarter hour (at most 60 fields: Redis's compact
listpack encoding) and its hours in one per day (at most 97), because a key costs about
100 bytes of its own: docs/OPERATIONS.md gives the memory bound and its measured figures.
Zero counts are not written.

Top keys, tenants and users are approximate once a bucket (a minute or an hour) holds more
than `top_k` (users: `user_top_k`) of them. A trim (Redis after each flush, or a worker's
buffer once it holds BUFFER_SLACK x top_k) cuts an entry only when top_k others have at least
as many in that bucket, so a count is never too high, and a cut loses at most 1/(top_k + 1)
of the bucket's count. A bucket with at most top_k entries is exact. Totals, blocked_by, the
shadow counts and every tenant's series are exact (at least once: a flush whose reply is
lost after Redis ran it is sent again).

Buckets are minutes of this process's `clock` (wall time), so workers with skewed clocks put
a decision in a neighbouring minute. All keys share the `{stats}` hash tag, so a flush is one
MULTI/EXEC on one node; on Redis Cluster that is one slot for all statistics.
"""

from __future__ import annotations

import heapq
import json
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .errors import ConfigError, InvalidRequest, StoreUnavailable
from .stats_memory import MemoryStatsStore

MINUTE, HOUR, DAY = 60, 3600, 86400
QUARTER = 15 * MINUTE  # a tenant's minutes are kept in one hash per quarter hour
# A worker trims a bucket's keys to top_k once it holds this many times top_k: the buffer
# stays bounded between flushes and while Redis is down, whatever the traffic.
BUFFER_SLACK = 10
# While Redis is down a worker keeps this many minutes of counts and sends them when it is back:
# an outage's "store unavailable" denials are what an operator wants to see afterwards.
KEPT_MINUTES = 15
# Keys outlive the last window that can read them by this much (clock skew between workers).
TTL_SLACK = 60
# blocked_by names are bounded by the policy; this only guards against a caller's own names.
LEVEL_CACHE_SIZE = 10_000
# Tenants counted per buffered minute; more (a flood of made-up team keys) go uncounted
# per tenant (the totals still count them), so that the buffer stays bounded.
MAX_TENANTS = 100_000
# Recently seen users kept for search, most recent first.
SEEN_USERS = 10_000
# An open reservation whose expiry passed this long ago, and that no worker settled, is
# counted as expired (a settlement reaches the statistics within a flush or two).
EXPIRY_GRACE = 10.0
SWEEP_EVERY = 5.0
SWEEP_BATCH = 1000
DECISIONS, DENIED, SHADOW, BY, SHADOW_BY = "decisions", "denied", "shadow", "by:", "sh:"
# A tenant series' fields: decisions, denied, shadow-denied, cost.
SERIES_FIELDS = {"d": "decisions", "x": "denied", "s": "shadow_denied", "c": "cost"}
STEPS = (MINUTE, HOUR)

log = logging.getLogger(__name__)
_live: weakref.WeakSet[DenialStats] = weakref.WeakSet()


class TenantCounts:
    """One tenant's counts in one minute."""

    __slots__ = ("decisions", "denied", "shadow", "cost", "blocked", "shadow_by", "users")

    def __init__(self) -> None:
        self.decisions = self.denied = self.shadow = 0
        self.cost = 0.0
        self.blocked: dict[str, int] = {}
        self.shadow_by: dict[str, int] = {}
        self.users: dict[str, list[int]] = {}  # user -> [decisions, denied]

    def add(self, other: TenantCounts, user_cap: int, user_top_k: int) -> None:
        self.decisions += other.decisions
        self.denied += other.denied
        self.shadow += other.shadow
        self.cost += other.cost
        _add(self.blocked, other.blocked)
        _add(self.shadow_by, other.shadow_by)
        for user, (decisions, denied) in other.users.items():
            mine = self.users.get(user)
            if mine is None:
                self.users[user] = [decisions, denied]
            else:
                mine[0] += decisions
                mine[1] += denied
        if len(self.users) > user_cap:
            self.users = _top_users(self.users, user_top_k)


class MinuteCounts:
    """One minute's counts: totals, by blocked_by and shadow rule, denied keys and tenants,
    and each tenant's own."""

    __slots__ = ("decisions", "denied", "shadow", "blocked", "shadow_by", "keys", "tenants_denied", "tenants")

    def __init__(self) -> None:
        self.decisions = self.denied = self.shadow = 0
        self.blocked: dict[str, int] = {}
        self.shadow_by: dict[str, int] = {}
        self.keys: dict[str, dict[Any, int]] = {}  # level -> key (user level: (user, team)) -> denials
        self.tenants_denied: dict[str, int] = {}
        self.tenants: dict[str, TenantCounts] = {}

    def add(self, other: MinuteCounts, stats: DenialStats, cap: int, top_k: int) -> None:
        """Add `other` in; a bucket holding more than `cap` entries is trimmed to `top_k`."""
        self.decisions += other.decisions
        self.denied += other.denied
        self.shadow += other.shadow
        _add(self.blocked, other.blocked)
        _add(self.shadow_by, other.shadow_by)
        for level, counts in other.keys.items():
            mine = _add(self.keys.setdefault(level, {}), counts)
            if len(mine) > cap:
                self.keys[level] = _top(mine, top_k)
        _add(self.tenants_denied, other.tenants_denied)
        if len(self.tenants_denied) > cap:
            self.tenants_denied = _top(self.tenants_denied, top_k)
        for tenant, counts in other.tenants.items():
            self.tenants.setdefault(tenant, TenantCounts()).add(counts, stats._user_cap, stats.user_top_k)


class DenialStats:
    """Decisions, denials and shadow denials by rule, the most denied tenants and keys, and
    every tenant's traffic over time. `client` is a redis-py client shared by every worker,
    or None for this process alone. `tier_of(tenant)` names the tier a tenant resolves to
    (asked when a flush sends its counts, off the decision's path)."""

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
        _check_options(top_k, retention, flush_every, usage_minutes, usage_hours, user_top_k)
        self.shared = client is not None
        self.client = client if client is not None else MemoryStatsStore(clock)
        self.prefix, self.clock = prefix, clock
        self.flush_every, self.top_k, self.retention = flush_every, top_k, retention
        self.tenant_level, self.user_level = tenant_level, user_level
        self.usage_minutes, self.usage_hours, self.user_top_k = usage_minutes, usage_hours, user_top_k
        self.tier_of, self.on_expired = tier_of, on_expired
        self._buffer_cap = BUFFER_SLACK * top_k
        self._user_cap = BUFFER_SLACK * user_top_k
        self._store_errors = _redis_errors() if self.shared else ()
        self._levels: set[str] = set()  # levels known to have top-key sets
        self._level_of: dict[str, str] = {}  # blocked_by -> its level, worked out once
        self._ids: dict[str, str] = {}  # rule name -> its short id in the shared store
        self._last_flush = clock()
        self._next_sweep = -math.inf
        self._failing = False
        self.failed_records = 0  # records that raised (a bug), so not counted
        self.dropped_minutes = 0  # minutes of counts given up during a long Redis outage
        self.untracked_tenants = 0  # decisions of tenants past MAX_TENANTS in a minute
        self.expired_reservations = 0  # counted by this process's sweeps
        self._start_afresh()
        _live.add(self)

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

    def record(self, keys: Mapping[str, str], decision: Any, cost: float = 1) -> None:
        """Count one decision: for its tenant and user, and for a denial its blocked_by and
        the key at the blocking level; `cost` counts as taken when it was allowed.
        In process and thread-safe; never raises, never does I/O."""
        lock = self._lock
        try:
            now = self.clock()
            lock.acquire()  # not `with`: half the cost, and this runs on every decision
            try:
                counts = self._current if self._since <= now < self._until else self._counts_at(now)
                counts.decisions += 1
                team = keys.get(self.tenant_level)
                tenant = None
                if team is not None:
                    tenant = counts.tenants.get(team)
                    if tenant is None:
                        tenant = self._new_tenant(counts, team)
                if decision.allowed:
                    if tenant is not None:
                        tenant.decisions += 1
                        tenant.cost += cost
                        user = keys.get(self.user_level)
                        if user is not None:
                            self._count_user(tenant, user, 0)
                else:
                    self._count_denial(counts, keys, decision.blocked_by, team, tenant)
                if decision.shadow_blocked:
                    self._count_shadow(counts, decision.shadow_blocked, tenant)
            finally:
                lock.release()
        except Exception:  # statistics must never break the decision they describe
            self.failed_records += 1
        if self._thread is None and self.flush_every:
            self._start_flushing()

    def _counts_at(self, now: float) -> MinuteCounts:
        """The buffered minute of `now`, remembered as the current one (called locked)."""
        minute = _floor(now, MINUTE)
        counts = self._buffer.get(minute)
        if counts is None:
            counts = self._buffer[minute] = MinuteCounts()
        self._current, self._since, self._until = counts, minute, minute + MINUTE
        return counts

    def _forget_current(self) -> None:
        self._current: MinuteCounts | None = None
        self._since, self._until = math.inf, -math.inf

    def _new_tenant(self, counts: MinuteCounts, team: str) -> TenantCounts | None:
        if len(counts.tenants) >= MAX_TENANTS:
            self.untracked_tenants += 1
            return None
        tenant = counts.tenants[team] = TenantCounts()
        return tenant

    def _count_user(self, tenant: TenantCounts, user: str, denied: int) -> None:
        users = tenant.users
        counts = users.get(user)
        if counts is None:
            users[user] = [1, denied]
            if len(users) >= self._user_cap:
                tenant.users = _top_users(users, self.user_top_k)
        else:
            counts[0] += 1
            counts[1] += denied

    def _count_denial(
        self,
        counts: MinuteCounts,
        keys: Mapping[str, str],
        blocked_by: str | None,
        team: str | None,
        tenant: TenantCounts | None,
    ) -> None:
        counts.denied += 1
        user = keys.get(self.user_level)
        if team is not None:
            denied = counts.tenants_denied
            denied[team] = denied.get(team, 0) + 1
            if len(denied) >= self._buffer_cap:
                counts.tenants_denied = _top(denied, self.top_k)
        if tenant is not None:
            tenant.decisions += 1
            tenant.denied += 1
            if blocked_by is not None:
                tenant.blocked[blocked_by] = tenant.blocked.get(blocked_by, 0) + 1
            if user is not None:
                self._count_user(tenant, user, 1)
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
        if level == self.user_level:
            key = (key, team)  # a user is always its team's: "shared" in two teams is two users
        by_key = counts.keys.get(level)
        if by_key is None:
            by_key = counts.keys[level] = {}
        by_key[key] = by_key.get(key, 0) + 1
        if len(by_key) >= self._buffer_cap:
            counts.keys[level] = _top(by_key, self.top_k)

    @staticmethod
    def _count_shadow(counts: MinuteCounts, names: Iterable[str], tenant: TenantCounts | None) -> None:
        counts.shadow += 1
        for name in names:
            counts.shadow_by[name] = counts.shadow_by.get(name, 0) + 1
        if tenant is not None:
            tenant.shadow += 1
            for name in names:
                tenant.shadow_by[name] = tenant.shadow_by.get(name, 0) + 1

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

    # --- reading -------------------------------------------------------------------------------

    def report(self, window: float, top: int = 10, step: float | None = None) -> dict:
        """Decisions and denials over the last `window` seconds, in whole minutes: `since` is
        the start of the first minute read, so a decision up to a minute older than the
        window may count. `step` (a multiple of 60 s) groups the series. Raises
        InvalidRequest for a bad argument and StoreUnavailable when Redis cannot be reached."""
        window = _check_window(window, self.retention)
        top = _check_whole(top, "top", 1, self.top_k)
        step = MINUTE if step is None else _check_step(step, self.retention)
        self._flush()
        now = self.clock()
        first, last = _floor(now - window, MINUTE), _floor(now, MINUTE)
        totals, keys, tenants = self._read_report(range(first, last + MINUTE, MINUTE), *_key_spans(first, last))
        return {
            "window": window,
            "since": first,
            "until": now,
            **_summary(totals, keys, tenants, top, self.user_level),
            "series": _series(totals, first, last, step),
        }

    def usage(self, tenant: str, window: float, step: int = MINUTE, top: int = 10) -> dict:
        """One tenant's decisions, allowed, denied, shadow-denied and cost per `step` (60 or
        3600 s) over the last `window` seconds; its blocked_by and shadow rules and most
        throttled users over the whole hours the window touches (`breakdown_since`; users
        over the last `usage_minutes` of them at most). `has_traffic` is false when nothing
        was recorded for it in the window."""
        if isinstance(step, bool) or step not in STEPS:
            raise InvalidRequest(f"must be 60 (a minute) or 3600 (an hour), got {step!r}", "step")
        step = int(step)
        window = _check_window(window, self.usage_minutes if step == MINUTE else self.usage_hours)
        top = _check_whole(top, "top", 1, self.user_top_k)
        self._flush()
        now = self.clock()
        first, last = _floor(now - window, step), _floor(now, step)
        first_hour = _floor(first, HOUR)
        days = range(_floor(first_hour, DAY), last + 1, DAY)
        series_keys = (
            [self._key("um", q, tenant) for q in range(_floor(first, QUARTER), last + 1, QUARTER)]
            if step == MINUTE
            else []
        )
        user_hours = range(max(first_hour, _floor(now - self.usage_minutes, HOUR)), last + 1, HOUR)
        pipe = self.client.pipeline(transaction=False)
        for name in series_keys:
            pipe.hgetall(name)
        for kind in ("uh", "ub"):
            for day in days:
                pipe.hgetall(self._key(kind, day, tenant))
        for kind in ("uu", "ux"):
            for hour in user_hours:
                pipe.zrange(self._key(kind, hour, tenant), 0, -1, withscores=True)
        pipe.hgetall(self._key("rule-names"))
        replies = iter(self._execute_read(pipe))
        quarters = [next(replies) for _ in series_keys]
        hours = [next(replies) for _ in days]
        breakdowns = [next(replies) for _ in days]
        decided = _add_replies({}, (next(replies) for _ in user_hours))
        denied = _add_replies({}, (next(replies) for _ in user_hours))
        names = {_text(i): _text(name) for i, name in next(replies).items()}
        if step == MINUTE:
            points = _points(zip(range(_floor(first, QUARTER), last + 1, QUARTER), quarters), MINUTE)
        else:
            points = _points(zip(days, hours), HOUR)
        series = [_usage_point(start, points.get(start, {})) for start in range(first, last + 1, step)]
        blocked, shadow = _breakdown(zip(days, breakdowns), first_hour, names)
        return {
            "tenant": tenant,
            "tier": _latest_tier(hours),
            "window": window,
            "step": step,
            "since": first,
            "until": now,
            "breakdown_since": first_hour,
            "has_traffic": any(point["decisions"] for point in series) or bool(blocked or shadow),
            "series": series,
            "blocked_by": blocked,
            "shadow_blocked_by": shadow,
            "top_users": _top_user_rows(decided, denied, top),
        }

    def seen_users(self, prefix: str, limit: int = 10) -> list[dict]:
        """Users seen recently (within `usage_minutes`) whose key starts with `prefix`, most
        recent first: [{"user", "team"}]. Raises StoreUnavailable when Redis is down."""
        self._flush()
        pattern = _glob_escape("[" + json.dumps(prefix, ensure_ascii=False)[:-1]) + "*"
        try:
            found = list(self.client.zscan_iter(self._key("seen"), match=pattern, count=SEEN_USERS))
        except self._store_errors as error:
            raise StoreUnavailable(f"Redis cannot read the statistics: {error}") from error
        found.sort(key=lambda item: -float(item[1]))
        return [{"user": user, "team": team} for user, team in (_user_of(m) for m, _ in found[:limit])]

    # --- flushing ------------------------------------------------------------------------------

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
                self._unsent.setdefault(minute, MinuteCounts()).add(counts, self, self._buffer_cap, self.top_k)
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
            ids = self._rule_ids(
                {name for c in self._unsent.values() for t in c.tenants.values() for name in (*t.blocked, *t.shadow_by)}
            )
        except self._store_errors as error:
            self._keep_for_later(now, error)
            raise StoreUnavailable(f"Redis cannot take the statistics: {error}") from error
        pipe = self.client.pipeline(transaction=True)
        for minute, counts in self._unsent.items():
            ttl = self._ttl(minute, MINUTE, now, self.retention)
            if ttl > 0:
                self._queue_totals(pipe, minute, counts, ttl)
                for level, by_key in counts.keys.items():
                    self._queue_top(pipe, self._key("k", minute, level), _members(by_key), self.top_k, ttl)
                if counts.tenants_denied:
                    self._queue_top(pipe, self._key("t", minute), counts.tenants_denied, self.top_k, ttl)
        for hour, (levels, tenants) in _by_hour(self._unsent).items():
            ttl = self._ttl(hour, HOUR, now, self.retention)
            if ttl > 0:
                for level, by_key in levels.items():
                    self._queue_top(pipe, self._key("h", hour, level), _members(by_key), self.top_k, ttl)
                if tenants:
                    self._queue_top(pipe, self._key("ht", hour), tenants, self.top_k, ttl)
        self._queue_usage(pipe, now, ids)
        self._queue_reservations(pipe, now)
        try:
            pipe.execute()
        except self._store_errors as error:
            self._keep_for_later(now, error)
            raise StoreUnavailable(f"Redis cannot take the statistics: {error}") from error
        if self._failing:
            self._failing = False
            log.warning("denial statistics: Redis is back, kept counts sent")
        for counts in self._unsent.values():
            self._levels.update(counts.keys)

    def _queue_totals(self, pipe: Any, minute: int, counts: MinuteCounts, ttl: int) -> None:
        totals = self._key("m", minute)
        pipe.hincrby(totals, DECISIONS, counts.decisions)
        pipe.hincrby(totals, DENIED, counts.denied)
        if counts.shadow:
            pipe.hincrby(totals, SHADOW, counts.shadow)
        for blocked_by, n in counts.blocked.items():
            pipe.hincrby(totals, BY + blocked_by, n)
        for name, n in counts.shadow_by.items():
            pipe.hincrby(totals, SHADOW_BY + name, n)
        pipe.expire(totals, ttl)

    def _queue_top(self, pipe: Any, name: str, by_key: Mapping[str, int], top_k: int, ttl: int) -> None:
        """Add to a top set, trim it to top_k, and (re)set its TTL."""
        for key, n in by_key.items():
            pipe.zincrby(name, n, key)
        pipe.zremrangebyrank(name, 0, -top_k - 1)
        pipe.expire(name, ttl)

    def _queue_usage(self, pipe: Any, now: float, ids: Mapping[str, str]) -> None:
        """Each tenant's minutes (per quarter-hour hash), hours (per day), blocked_by and
        shadow rules (per day), users (per hour), and the users seen."""
        hours: dict[tuple[str, int], TenantCounts] = {}
        for minute, counts in self._unsent.items():
            quarter = _floor(minute, QUARTER)
            ttl = self._ttl(quarter, QUARTER, now, self.usage_minutes)
            for tenant, usage in counts.tenants.items():
                if ttl > 0:
                    self._queue_series(pipe, self._key("um", quarter, tenant), (minute - quarter) // MINUTE, usage, ttl)
                hours.setdefault((tenant, _floor(minute, HOUR)), TenantCounts()).add(
                    usage, self._user_cap, self.user_top_k
                )
        seen: dict[str, float] = {}
        for (tenant, hour), usage in hours.items():
            day = _floor(hour, DAY)
            index = (hour - day) // HOUR
            ttl = self._ttl(day, DAY, now, self.usage_hours)
            if ttl > 0:
                name = self._key("uh", day, tenant)
                self._queue_series(pipe, name, index, usage, ttl)
                tier = self._tier(tenant)
                if tier is not None:
                    pipe.hset(name, "t", tier)
                if usage.blocked or usage.shadow_by:
                    self._queue_breakdown(pipe, self._key("ub", day, tenant), index, usage, ids, ttl)
            ttl = self._ttl(hour, HOUR, now, self.usage_minutes)
            if ttl > 0 and usage.users:
                users = _top_users(usage.users, self.user_top_k) if len(usage.users) > self.user_top_k else usage.users
                decided = {user: n for user, (n, _) in users.items()}
                denied = {user: n for user, (_, n) in users.items() if n}
                self._queue_top(pipe, self._key("uu", hour, tenant), decided, self.user_top_k, ttl)
                if denied:
                    self._queue_top(pipe, self._key("ux", hour, tenant), denied, self.user_top_k, ttl)
            for user in usage.users:  # every user the buffer kept, not only the hour's top ones
                seen[_user_member(user, tenant)] = now
        if seen:
            name = self._key("seen")
            pipe.zadd(name, seen)
            pipe.zremrangebyscore(name, -math.inf, now - self.usage_minutes)
            pipe.zremrangebyrank(name, 0, -SEEN_USERS - 1)

    @staticmethod
    def _queue_series(pipe: Any, name: str, index: int, usage: TenantCounts, ttl: int) -> None:
        pipe.hincrby(name, f"{index}d", usage.decisions)
        if usage.denied:
            pipe.hincrby(name, f"{index}x", usage.denied)
        if usage.shadow:
            pipe.hincrby(name, f"{index}s", usage.shadow)
        if usage.cost:
            pipe.hincrbyfloat(name, f"{index}c", usage.cost)
        pipe.expire(name, ttl)

    @staticmethod
    def _queue_breakdown(
        pipe: Any, name: str, index: int, usage: TenantCounts, ids: Mapping[str, str], ttl: int
    ) -> None:
        for blocked_by, n in usage.blocked.items():
            pipe.hincrby(name, f"{index}b{ids[blocked_by]}", n)
        for rule, n in usage.shadow_by.items():
            pipe.hincrby(name, f"{index}s{ids[rule]}", n)
        pipe.expire(name, ttl)

    def _rule_ids(self, names: set[str]) -> dict[str, str]:
        """Short ids for rule names (`blocked_by`, shadow rules), shared by every worker: a
        tenant's breakdown names a rule by its id (2 or 3 bytes rather than 30 or more: it was
        most of a tenant's memory). Ids are kept in `rules` (name -> id) and `rule-names`
        (id -> name), which hold every rule name that ever denied: bounded by the policies."""
        missing = [name for name in names if name not in self._ids]
        if missing:
            pipe = self.client.pipeline(transaction=False)
            for name in missing:
                pipe.hget(self._key("rules"), name)
            for name, found in zip(missing, pipe.execute()):
                self._ids[name] = _text(found) if found is not None else self._new_rule_id(name)
        return {name: self._ids[name] for name in names}

    def _new_rule_id(self, name: str) -> str:
        candidate = _base36(int(self.client.pipeline(transaction=False).incr(self._key("rule-seq")).execute()[0]))
        pipe = self.client.pipeline(transaction=True)
        pipe.hsetnx(self._key("rules"), name, candidate)
        pipe.hget(self._key("rules"), name)
        _, winner = pipe.execute()  # another worker may have named it first: its id stands
        winner = _text(winner)
        self.client.pipeline(transaction=False).hset(self._key("rule-names"), winner, name).execute()
        return winner

    def _queue_reservations(self, pipe: Any, now: float) -> None:
        name = self._key("res")
        if self._unsent_opened:
            pipe.zadd(name, self._unsent_opened)
        if self._unsent_settled:
            pipe.zrem(name, *self._unsent_settled)

    def _sweep(self, now: float) -> None:
        """Count the reservations left open past their expiry: each is removed from the
        open set by exactly one process (ZREM answers how many it removed), which counts it."""
        name = self._key("res")
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.zrangebyscore(name, -math.inf, now - EXPIRY_GRACE, 0, SWEEP_BATCH)
            expired = [_text(member) for member in pipe.execute()[0]]
            if not expired:
                return
            pipe = self.client.pipeline(transaction=False)
            pipe.zrem(name, *expired)
            removed = int(pipe.execute()[0])
        except self._store_errors:
            return  # swept at the next flush
        self.expired_reservations += removed
        if removed and self.on_expired is not None:
            try:
                self.on_expired(removed)
            except Exception:
                log.exception("denial statistics: on_expired failed")

    def _tier(self, tenant: str) -> str | None:
        if self.tier_of is None:
            return None
        try:
            return self.tier_of(tenant)
        except Exception:
            log.exception("denial statistics: tier_of(%r) failed", tenant)
            return None

    def _keep_for_later(self, now: float, error: Exception) -> None:
        """Redis is down: keep the newest KEPT_MINUTES minutes, each bucket at top_k."""
        if not self._failing:
            self._failing = True
            log.warning("denial statistics: Redis unreachable, keeping counts: %s", error)
        newest = sorted(self._unsent, reverse=True)
        kept = {m: self._unsent[m] for m in newest[:KEPT_MINUTES] if self._ttl(m, MINUTE, now, self.retention) > 0}
        self.dropped_minutes += len(self._unsent) - len(kept)
        for counts in kept.values():
            counts.keys = {level: _trimmed(by_key, self.top_k) for level, by_key in counts.keys.items()}
            counts.tenants_denied = _trimmed(counts.tenants_denied, self.top_k)
        self._unsent = kept

    @staticmethod
    def _ttl(start: int, span: int, now: float, retention: float) -> int:
        """Seconds until no window can read the bucket: relative, so that it follows `clock`."""
        return math.ceil(start + span + retention + TTL_SLACK - now)

    def _key(self, kind: str, *parts: Any) -> str:
        return ":".join((self.prefix, "{stats}", kind, *map(str, parts)))

    # --- reading -------------------------------------------------------------------------------

    def _read_report(self, minutes: range, edge: range, hours: range) -> tuple[dict, dict, dict]:
        """Every minute's totals, the known levels' top keys and the top tenants in one round
        trip; a second only for levels another worker denied at and this one has not seen."""
        known = sorted(self._levels)
        sets = self._top_sets(edge, hours, known)
        tenant_sets = [self._key("t", m) for m in edge] + [self._key("ht", h) for h in hours]
        pipe = self.client.pipeline(transaction=False)
        for m in minutes:
            pipe.hgetall(self._key("m", m))
        for name in [*(name for _, name in sets), *tenant_sets]:
            pipe.zrange(name, 0, -1, withscores=True)
        replies = self._execute_read(pipe)
        totals = {m: _totals_from(hash_) for m, hash_ in zip(minutes, replies) if hash_}
        keys: dict[str, dict[str, int]] = {}
        _add_tops(keys, sets, replies[len(minutes) : len(minutes) + len(sets)])
        tenants = _add_replies({}, replies[len(minutes) + len(sets) :])
        new = sorted({_level(name) for c in totals.values() for name in c.blocked} - self._levels)
        if new:
            sets = self._top_sets(edge, hours, new)
            pipe = self.client.pipeline(transaction=False)
            for _, name in sets:
                pipe.zrange(name, 0, -1, withscores=True)
            _add_tops(keys, sets, self._execute_read(pipe))
            self._levels.update(new)
        return totals, keys, tenants

    def _top_sets(self, edge: range, hours: range, levels: list[str]) -> list[tuple[str, str]]:
        """(level, set name) of the minutes at the window's edge and of its whole hours."""
        return [
            (level, name)
            for level in levels
            for name in [*(self._key("k", m, level) for m in edge), *(self._key("h", h, level) for h in hours)]
        ]

    def _execute_read(self, pipe: Any) -> list:
        try:
            return pipe.execute()
        except self._store_errors as error:
            raise StoreUnavailable(f"Redis cannot read the statistics: {error}") from error


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


def _add(into: dict, counts: Mapping) -> dict:
    for name, n in counts.items():
        into[name] = into.get(name, 0) + n
    return into


def _top(counts: Mapping, k: int) -> dict:
    """The k largest counts; ties keep the greater key, as Redis's rank order does."""
    return dict(heapq.nlargest(k, counts.items(), key=lambda item: (item[1], _sortable(item[0]))))


def _sortable(key: Any) -> Any:
    return key if isinstance(key, str) else (key[0], key[1] or "")


def _trimmed(counts: dict, k: int) -> dict:
    return counts if len(counts) <= k else _top(counts, k)


def _top_users(users: Mapping[str, list[int]], k: int) -> dict[str, list[int]]:
    """The k most denied and the k most active users (both top sets are kept)."""
    chosen = set(heapq.nlargest(k, users, key=lambda u: (users[u][1], u)))
    chosen.update(heapq.nlargest(k, users, key=lambda u: (users[u][0], u)))
    return {user: users[user] for user in chosen}


def _by_hour(minutes: Mapping[int, MinuteCounts]) -> dict[int, tuple[dict, dict]]:
    """The denied keys of each level and the denied tenants, added up by hour."""
    hours: dict[int, tuple[dict, dict]] = {}
    for minute, counts in minutes.items():
        levels, tenants = hours.setdefault(_floor(minute, HOUR), ({}, {}))
        for level, by_key in counts.keys.items():
            _add(levels.setdefault(level, {}), by_key)
        _add(tenants, counts.tenants_denied)
    return hours


def _members(by_key: Mapping) -> dict[str, int]:
    """Set members as stored: a user level's (user, team) as JSON, other keys as they are."""
    return {_user_member(*key) if isinstance(key, tuple) else key: n for key, n in by_key.items()}


def _user_member(user: str, team: str | None) -> str:
    return json.dumps([user, team], ensure_ascii=False, separators=(",", ":"))


def _user_of(member: Any) -> tuple[str, str | None]:
    user, team = json.loads(_text(member))
    return user, team


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, rest = divmod(n, 36)
        out = digits[rest] + out
        if not n:
            return out


def _floor(t: float, span: int) -> int:
    return int(t // span) * span


def _level(blocked_by: str) -> str:
    return blocked_by.partition(": ")[0]


def _key_spans(first: int, last: int) -> tuple[range, range]:
    """Where a window's top keys are read: minute sets from `first` up to its first whole
    hour, and hourly sets from there to `last` (the current hour holds nothing after now)."""
    first_hour = first if first % HOUR == 0 else first - first % HOUR + HOUR
    return range(first, min(first_hour, last + MINUTE), MINUTE), range(first_hour, last + 1, HOUR)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\^-" else c for c in text)


def _totals_from(hash_: Mapping) -> MinuteCounts:
    counts = MinuteCounts()
    for field, value in hash_.items():
        field, n = _text(field), int(value)
        if field == DECISIONS:
            counts.decisions = n
        elif field == DENIED:
            counts.denied = n
        elif field == SHADOW:
            counts.shadow = n
        elif field.startswith(BY):
            counts.blocked[field[len(BY) :]] = n
        elif field.startswith(SHADOW_BY):
            counts.shadow_by[field[len(SHADOW_BY) :]] = n
    return counts


def _add_tops(keys: dict[str, dict[str, int]], sets: list[tuple[str, str]], replies: list) -> None:
    """Add ZRANGE replies, in the order of `sets`, to each level's key counts."""
    for (level, _), members in zip(sets, replies):
        if members:
            _add(keys.setdefault(level, {}), {_text(key): int(score) for key, score in members})


def _add_replies(into: dict[str, int], replies: Iterable) -> dict[str, int]:
    for members in replies:
        _add(into, {_text(key): int(score) for key, score in members or ()})
    return into


def _points(buckets: Iterable[tuple[int, Mapping]], span: int) -> dict[int, dict[str, float]]:
    """A series hash per quarter (or day) -> the counts of each minute (or hour) in it."""
    points: dict[int, dict[str, float]] = {}
    for start, hash_ in buckets:
        for field, value in (hash_ or {}).items():
            field = _text(field)
            index, kind = field[:-1], field[-1:]
            if index.isdigit() and kind in SERIES_FIELDS:
                point = points.setdefault(start + int(index) * span, {})
                point[kind] = float(value) if kind == "c" else int(value)
    return points


def _usage_point(start: int, counts: Mapping[str, float]) -> dict:
    decisions, denied = counts.get("d", 0), counts.get("x", 0)
    return {
        "start": start,
        "decisions": decisions,
        "allowed": decisions - denied,
        "denied": denied,
        "shadow_denied": counts.get("s", 0),
        "cost": _whole(counts.get("c", 0.0)),
    }


def _whole(value: float) -> float | int:
    """Costs as the caller gave them: 12 rather than 12.0 when whole."""
    return int(value) if float(value).is_integer() else value


def _breakdown(
    days: Iterable[tuple[int, Mapping]], since: int, names: Mapping[str, str]
) -> tuple[dict[str, int], dict[str, int]]:
    """blocked_by and shadow rules (by their ids' `names`) from the hours at or after `since`,
    most first."""
    blocked: dict[str, int] = {}
    shadow: dict[str, int] = {}
    for day, hash_ in days:
        for field, value in (hash_ or {}).items():
            field = _text(field)
            digits = len(field) - len(field.lstrip("0123456789"))
            if not digits or day + int(field[:digits]) * HOUR < since:
                continue
            into = blocked if field[digits : digits + 1] == "b" else shadow
            name = names.get(field[digits + 1 :], field[digits + 1 :])
            into[name] = into.get(name, 0) + int(value)
    return _most_first_dict(blocked), _most_first_dict(shadow)


def _most_first_dict(counts: Mapping[str, int]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=_most_first))


def _latest_tier(days: list[Mapping]) -> str | None:
    for hash_ in reversed(days):
        for field, value in (hash_ or {}).items():
            if _text(field) == "t":
                return _text(value)
    return None


def _top_user_rows(decided: Mapping[str, int], denied: Mapping[str, int], top: int) -> list[dict]:
    """The most denied users first, then the most active; a user's decisions are at least
    its denials (its decisions may have been trimmed from an hour's top set)."""
    rows = []
    for user in set(denied) | set(decided):
        n_denied = denied.get(user, 0)
        rows.append({"user": user, "decisions": max(decided.get(user, 0), n_denied), "denied": n_denied})
    rows.sort(key=lambda row: (-row["denied"], -row["decisions"], row["user"]))
    return rows[:top]


# --- the report's shape -----------------------------------------------------------------------


def _summary(
    totals: Mapping[int, MinuteCounts], keys: Mapping[str, Mapping[str, int]], tenants: Mapping, top: int, user_level
) -> dict:
    blocked: dict[str, int] = {}
    shadow: dict[str, int] = {}
    for counts in totals.values():
        _add(blocked, counts.blocked)
        _add(shadow, counts.shadow_by)
    return {
        "decisions": sum(counts.decisions for counts in totals.values()),
        "denied": sum(counts.denied for counts in totals.values()),
        "shadow_denied": sum(counts.shadow for counts in totals.values()),
        "blocked_by": _by_rule(blocked),
        "shadow_blocked_by": _by_rule(shadow),
        "top_tenants": [
            {"tenant": tenant, "denied": n} for tenant, n in sorted(tenants.items(), key=_most_first)[:top]
        ],
        "top_keys": {
            level: [_key_row(key, n, level == user_level) for key, n in sorted(by_key.items(), key=_most_first)[:top]]
            for level, by_key in sorted(keys.items())
        },
    }


def _by_rule(counts: Mapping[str, int]) -> list[dict]:
    return [
        {"blocked_by": name, "level": _level(name), "denied": n} for name, n in sorted(counts.items(), key=_most_first)
    ]


def _key_row(key: str, denied: int, is_user: bool) -> dict:
    if not is_user:
        return {"key": key, "denied": denied}
    try:
        user, team = _user_of(key)
    except (ValueError, TypeError):  # written before users carried their team
        user, team = key, None
    return {"key": user, "team": team, "denied": denied}


def _series(totals: Mapping[int, MinuteCounts], first: int, last: int, step: int) -> list[dict]:
    """One point per `step` (aligned to multiples of it) from `first` to `last`, zeros included."""
    points = {
        at: {"at": at, "decisions": 0, "denied": 0, "shadow_denied": 0, "blocked_by": {}}
        for at in range(first - first % step, last + 1, step)
    }
    for minute, counts in totals.items():
        point = points[minute - minute % step]
        point["decisions"] += counts.decisions
        point["denied"] += counts.denied
        point["shadow_denied"] += counts.shadow
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


def _check_options(top_k: Any, retention: Any, flush_every: Any, minutes: Any, hours: Any, user_top_k: Any) -> None:
    for name, value in (("top_k", top_k), ("user_top_k", user_top_k)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"must be a whole number of at least 1, got {value!r}", name)
    for name, value, least in (("retention", retention, MINUTE), ("usage_minutes", minutes, MINUTE)):
        if not _is_number(value) or not least <= value < math.inf:
            raise ConfigError(f"must be at least {least} seconds, got {value!r}", name)
    if not _is_number(hours) or not HOUR <= hours < math.inf:
        raise ConfigError(f"must be at least {HOUR} seconds, got {hours!r}", "usage_hours")
    if flush_every is not None and (not _is_number(flush_every) or not 0 < flush_every < math.inf):
        raise ConfigError(f"must be seconds, more than 0, or None, got {flush_every!r}", "flush_every")


def _redis_errors() -> tuple[type[Exception], ...]:
    from redis.exceptions import RedisError  # here, so that in-process statistics need no redis-py

    return (RedisError,)


__all__ = ["DenialStats", "MinuteCounts", "TenantCounts"]
