"""What a flush writes, in one MULTI/EXEC: each minute's totals and top sets, each hour's top
sets, every tenant's series, blocked_by and users, the users seen and the open reservations;
the sweep that counts reservations left open past their expiry; and `Unsent`, a flush's batch,
which waits, bounded, while Redis is down."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from ..base36 import base36
from .counts import Key, MinuteCounts, TenantCounts, add_into, top_users
from .layout import (
    DAY,
    HOUR,
    MINUTE,
    QUARTER,
    SEEN_USERS,
    TIER,
    Bounds,
    StatsKeys,
    floor,
    members,
    queue_breakdown,
    queue_series,
    queue_totals,
    text,
    ttl,
    user_member,
)

# An open reservation whose expiry passed this long ago, and that no worker settled, is
# counted as expired (a settlement reaches the statistics within a flush or two).
EXPIRY_GRACE = 10.0
SWEEP_BATCH = 1000

log = logging.getLogger("core.stats")


class Unsent:
    """A flush's batch: minutes of counts and reservations opened and settled, not written yet;
    `sweep`: whether the flush also sweeps expired reservations. Kept while Redis is down."""

    def __init__(self, now: float = 0.0, sweep: bool = False) -> None:
        self.minutes: dict[int, MinuteCounts] = {}
        self.opened: dict[str, float] = {}  # reservation id -> expiry
        self.settled: set[str] = set()
        self.now, self.sweep = now, sweep

    def __len__(self) -> int:
        return len(self.minutes) + len(self.opened) + len(self.settled)

    def add(
        self, minutes: Mapping[int, MinuteCounts], opened: Mapping[str, float], settled: set[str], bounds: Bounds
    ) -> None:
        """Add a buffer's counts and reservations in; one opened and settled here cancel out."""
        for minute, counts in minutes.items():
            self.minutes.setdefault(minute, MinuteCounts()).add(counts, bounds.top_k, bounds.user_top_k)
        self.opened.update(opened)
        for reservation_id in settled:
            if self.opened.pop(reservation_id, None) is None:
                self.settled.add(reservation_id)

    def bound(self, kept_minutes: int, bounds: Bounds, now: float) -> int:
        """Keep the newest `kept_minutes` minutes still within the retention, each bucket cut
        to top_k; returns how many minutes were given up."""
        newest = sorted(self.minutes, reverse=True)[:kept_minutes]
        kept = {m: self.minutes[m] for m in newest if ttl(m, MINUTE, now, bounds.retention) > 0}
        dropped = len(self.minutes) - len(kept)
        for counts in kept.values():
            counts.trim(bounds.top_k)
        self.minutes = kept
        return dropped

    def clear(self) -> None:
        """Written: nothing of it may be written again."""
        self.minutes, self.opened, self.settled = {}, {}, set()


class StatsWriter:
    """Writes flushed counts to `client` (a redis-py client, or the in-process store), names
    rules by short ids, and removes expired reservations. The store's errors pass through."""

    def __init__(
        self, client: Any, keys: StatsKeys, bounds: Bounds, tier_of: Callable[[str], str | None] | None
    ) -> None:
        self.client, self.keys, self.bounds, self.tier_of = client, keys, bounds, tier_of
        self._ids: dict[str, str] = {}  # rule name -> its short id in the shared store

    def send(
        self, minutes: Mapping[int, MinuteCounts], opened: dict[str, float], settled: set[str], now: float
    ) -> None:
        """Write the counts of `minutes`, and the reservations `opened` and `settled`, in one
        MULTI/EXEC (rules never named before take a round trip or two first)."""
        ids = self.rule_ids(
            {
                name
                for c in minutes.values()
                for t in c.tenants.values()
                for name in (*t.blocked, *t.shadow_by, *t.over_quota_by)
            }
        )
        pipe = self.client.pipeline(transaction=True)
        for minute, counts in minutes.items():
            expiry = ttl(minute, MINUTE, now, self.bounds.retention)
            if expiry > 0:
                queue_totals(pipe, self.keys.totals(minute), counts, expiry)
                self._queue_tops(pipe, MINUTE, minute, counts.keys, counts.tenants_denied, expiry)
        for hour, (levels, tenants) in _by_hour(minutes).items():
            expiry = ttl(hour, HOUR, now, self.bounds.retention)
            if expiry > 0:
                self._queue_tops(pipe, HOUR, hour, levels, tenants, expiry)
        self._queue_usage(pipe, minutes, now, ids)
        if opened:
            pipe.zadd(self.keys.reservations, opened)
        if settled:
            pipe.zrem(self.keys.reservations, *settled)
        pipe.execute()

    def _queue_tops(
        self,
        pipe: Any,
        span: int,
        start: int,
        levels: Mapping[str, Mapping[Key, int]],
        tenants: Mapping[str, int],
        expiry: int,
    ) -> None:
        """The most denied keys of each level and the most denied tenants of a minute or hour."""
        for level, by_key in levels.items():
            _queue_top(pipe, self.keys.top_keys(span, start, level), members(by_key), self.bounds.top_k, expiry)
        if tenants:
            _queue_top(pipe, self.keys.top_tenants(span, start), tenants, self.bounds.top_k, expiry)

    def _queue_usage(self, pipe: Any, minutes: Mapping[int, MinuteCounts], now: float, ids: Mapping[str, str]) -> None:
        """Each tenant's minutes (per quarter-hour hash), hours (per day), blocked_by, shadow
        rules and soft quotas gone over (per day), users (per hour), and the users seen."""
        hours: dict[tuple[str, int], TenantCounts] = {}
        for minute, counts in minutes.items():
            quarter = floor(minute, QUARTER)
            expiry = ttl(quarter, QUARTER, now, self.bounds.usage_minutes)
            for tenant, usage in counts.tenants.items():
                if expiry > 0:
                    name = self.keys.tenant_minutes(quarter, tenant)
                    queue_series(pipe, name, (minute - quarter) // MINUTE, usage, expiry)
                hours.setdefault((tenant, floor(minute, HOUR)), TenantCounts()).add(usage, self.bounds.user_top_k)
        seen: dict[str, float] = {}
        for (tenant, hour), usage in hours.items():
            self._queue_tenant_hour(pipe, tenant, hour, usage, now, ids)
            for user in usage.users:  # every user the buffer kept, not only the hour's top ones
                seen[user_member(user, tenant)] = now
        if seen:
            pipe.zadd(self.keys.seen, seen)
            pipe.zremrangebyscore(self.keys.seen, -math.inf, now - self.bounds.usage_minutes)
            pipe.zremrangebyrank(self.keys.seen, 0, -SEEN_USERS - 1)

    def _queue_tenant_hour(
        self, pipe: Any, tenant: str, hour: int, usage: TenantCounts, now: float, ids: Mapping[str, str]
    ) -> None:
        """One tenant's hour: in its day's series and breakdown, and its users of the hour."""
        day = floor(hour, DAY)
        index = (hour - day) // HOUR
        expiry = ttl(day, DAY, now, self.bounds.usage_hours)
        if expiry > 0:
            name = self.keys.tenant_hours(day, tenant)
            queue_series(pipe, name, index, usage, expiry)
            tier = self._tier(tenant)
            if tier is not None:
                pipe.hset(name, TIER, tier)
            if usage.blocked or usage.shadow_by or usage.over_quota_by:
                queue_breakdown(pipe, self.keys.tenant_breakdown(day, tenant), index, usage, ids, expiry)
        expiry = ttl(hour, HOUR, now, self.bounds.usage_minutes)
        k = self.bounds.user_top_k
        if expiry > 0 and usage.users:
            users = top_users(usage.users, k) if len(usage.users) > k else usage.users
            decided = {user: n for user, (n, _) in users.items()}
            denied = {user: n for user, (_, n) in users.items() if n}
            _queue_top(pipe, self.keys.tenant_users(hour, tenant), decided, k, expiry)
            if denied:
                _queue_top(pipe, self.keys.tenant_denied_users(hour, tenant), denied, k, expiry)

    def _tier(self, tenant: str) -> str | None:
        if self.tier_of is None:
            return None
        try:
            return self.tier_of(tenant)
        except Exception:
            log.exception("denial statistics: tier_of(%r) failed", tenant)
            return None

    def rule_ids(self, names: set[str]) -> dict[str, str]:
        """Short ids for rule names (`blocked_by`, shadow rules, soft quotas gone over), shared
        by every worker: a tenant's breakdown names a rule by its id (2 or 3 bytes rather than
        30 or more: it was most of a tenant's memory). Ids are kept in `rules` (name -> id) and
        `rule-names` (id -> name), which hold every rule name that ever denied or went over a
        quota: bounded by the policies."""
        missing = [name for name in names if name not in self._ids]
        if missing:
            pipe = self.client.pipeline(transaction=False)
            for name in missing:
                pipe.hget(self.keys.rules, name)
            for name, found in zip(missing, pipe.execute()):
                self._ids[name] = text(found) if found is not None else self.new_rule_id(name)
        return {name: self._ids[name] for name in names}

    def new_rule_id(self, name: str) -> str:
        """Name a rule that had no id: a new one, or the id another worker gave it first."""
        candidate = base36(int(self.client.pipeline(transaction=False).incr(self.keys.rule_seq).execute()[0]))
        pipe = self.client.pipeline(transaction=True)
        pipe.hsetnx(self.keys.rules, name, candidate)
        pipe.hget(self.keys.rules, name)
        _, winner = pipe.execute()  # another worker may have named it first: its id stands
        winner = text(winner)
        self.client.pipeline(transaction=False).hset(self.keys.rule_names, winner, name).execute()
        return winner

    def sweep(self, now: float) -> int:
        """Remove the reservations left open past their expiry (and EXPIRY_GRACE) from the
        open set: how many this call removed. ZREM answers how many it removed, so each is
        counted by exactly one process."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zrangebyscore(self.keys.reservations, -math.inf, now - EXPIRY_GRACE, 0, SWEEP_BATCH)
        expired = [text(member) for member in pipe.execute()[0]]
        if not expired:
            return 0
        pipe = self.client.pipeline(transaction=False)
        pipe.zrem(self.keys.reservations, *expired)
        return int(pipe.execute()[0])


def _queue_top(pipe: Any, name: str, by_key: Mapping[str, int], top_k: int, expiry: int) -> None:
    """Add to a top set, trim it to top_k, and (re)set its TTL."""
    for key, n in by_key.items():
        pipe.zincrby(name, n, key)
    pipe.zremrangebyrank(name, 0, -top_k - 1)
    pipe.expire(name, expiry)


def _by_hour(minutes: Mapping[int, MinuteCounts]) -> dict[int, tuple[dict[str, dict[Key, int]], dict[str, int]]]:
    """The denied keys of each level and the denied tenants, added up by hour."""
    hours: dict[int, tuple[dict[str, dict[Key, int]], dict[str, int]]] = {}
    for minute, counts in minutes.items():
        levels, tenants = hours.setdefault(floor(minute, HOUR), ({}, {}))
        for level, by_key in counts.keys.items():
            add_into(levels.setdefault(level, {}), by_key)
        add_into(tenants, counts.tenants_denied)
    return hours
