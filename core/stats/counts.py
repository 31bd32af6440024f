"""The counts a worker buffers between flushes, and the tally that adds one decision to them.

The tally runs on the decision's path, under the statistics' lock: a few dict updates, no I/O.
Every bucket stays bounded whatever the traffic: a bucket of keys or tenants that reaches
BUFFER_SLACK x top_k is trimmed to its top_k (a tenant's users likewise to user_top_k), and
tenants past MAX_TENANTS in a minute are counted in the totals only. A trim cuts an entry only
when top_k others have at least as many, so a count is never too high.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import TypeVar

from ..decision import Decision

# A worker trims a bucket's keys to top_k once it holds this many times top_k: the buffer
# stays bounded between flushes and while Redis is down, whatever the traffic.
BUFFER_SLACK = 10
# blocked_by names are bounded by the policy; this only guards against a caller's own names.
LEVEL_CACHE_SIZE = 10_000
# Tenants counted per buffered minute; more (a flood of made-up team keys) go uncounted
# per tenant (the totals still count them), so that the buffer stays bounded.
MAX_TENANTS = 100_000

# A denied key as counted: at the user level (user, team), at any other level the key itself.
Key = str | tuple[str, str | None]
K = TypeVar("K", bound=Key)


class Counts:
    """Decisions, denials, shadow denials and decisions let go over a soft quota, by
    blocked_by, by shadow rule and by soft quota; and how many of the decisions (and of the
    denials) a Django app made in its own views (`embedded`, policies.embedding)."""

    __slots__ = (
        "decisions",
        "denied",
        "shadow",
        "over_quota",
        "embedded",
        "embedded_denied",
        "blocked",
        "shadow_by",
        "over_quota_by",
    )

    def __init__(self) -> None:
        self.decisions = self.denied = self.shadow = self.over_quota = 0
        self.embedded = self.embedded_denied = 0
        self.blocked: dict[str, int] = {}
        self.shadow_by: dict[str, int] = {}
        self.over_quota_by: dict[str, int] = {}

    def add_counts(self, other: Counts) -> None:
        """Add `other`'s decisions, denials, shadow denials and over-quota decisions in."""
        self.decisions += other.decisions
        self.denied += other.denied
        self.shadow += other.shadow
        self.over_quota += other.over_quota
        self.embedded += other.embedded
        self.embedded_denied += other.embedded_denied
        add_into(self.blocked, other.blocked)
        add_into(self.shadow_by, other.shadow_by)
        add_into(self.over_quota_by, other.over_quota_by)

    def count_shadow(self, names: Iterable[str]) -> None:
        """One decision that the shadow rules `names` would have denied."""
        self.shadow += 1
        shadow_by = self.shadow_by
        for name in names:
            shadow_by[name] = shadow_by.get(name, 0) + 1

    def count_over_quota(self, names: Iterable[str]) -> None:
        """One decision let go past (or further past) the soft quotas `names`."""
        self.over_quota += 1
        over_quota_by = self.over_quota_by
        for name in names:
            over_quota_by[name] = over_quota_by.get(name, 0) + 1


class TenantCounts(Counts):
    """One tenant's counts in one minute, with the cost it took and its users."""

    __slots__ = ("cost", "users")

    def __init__(self) -> None:
        super().__init__()
        self.cost = 0.0
        self.users: dict[str, list[int]] = {}  # user -> [decisions, denied]

    def add(self, other: TenantCounts, user_top_k: int) -> None:
        """Add `other` in; more than BUFFER_SLACK x user_top_k users are trimmed to the top ones."""
        self.add_counts(other)
        self.cost += other.cost
        for user, (decisions, denied) in other.users.items():
            mine = self.users.get(user)
            if mine is None:
                self.users[user] = [decisions, denied]
            else:
                mine[0] += decisions
                mine[1] += denied
        if len(self.users) > BUFFER_SLACK * user_top_k:
            self.users = top_users(self.users, user_top_k)


class MinuteCounts(Counts):
    """One minute's counts: totals, by blocked_by, shadow rule and soft quota, denied keys
    and tenants, and each tenant's own."""

    __slots__ = ("keys", "tenants_denied", "tenants")

    def __init__(self) -> None:
        super().__init__()
        self.keys: dict[str, dict[Key, int]] = {}  # level -> key -> denials
        self.tenants_denied: dict[str, int] = {}
        self.tenants: dict[str, TenantCounts] = {}

    def add(self, other: MinuteCounts, top_k: int, user_top_k: int) -> None:
        """Add `other` in; a bucket holding more than BUFFER_SLACK x top_k entries is trimmed
        to `top_k`."""
        cap = BUFFER_SLACK * top_k
        self.add_counts(other)
        for level, by_key in other.keys.items():
            mine = add_into(self.keys.setdefault(level, {}), by_key)
            if len(mine) > cap:
                self.keys[level] = top(mine, top_k)
        add_into(self.tenants_denied, other.tenants_denied)
        if len(self.tenants_denied) > cap:
            self.tenants_denied = top(self.tenants_denied, top_k)
        for tenant, usage in other.tenants.items():
            self.tenants.setdefault(tenant, TenantCounts()).add(usage, user_top_k)

    def trim(self, top_k: int) -> None:
        """Cut each bucket of keys and tenants to its `top_k`."""
        self.keys = {level: trimmed(by_key, top_k) for level, by_key in self.keys.items()}
        self.tenants_denied = trimmed(self.tenants_denied, top_k)


class Tally:
    """Adds one decision to a minute's counts; the caller holds the buffer's lock."""

    def __init__(self, tenant_level: str, user_level: str, top_k: int, user_top_k: int) -> None:
        self.tenant_level, self.user_level = tenant_level, user_level
        self.top_k, self.user_top_k = top_k, user_top_k
        self._buffer_cap = BUFFER_SLACK * top_k
        self._user_cap = BUFFER_SLACK * user_top_k
        self.untracked_tenants = 0  # decisions of tenants past MAX_TENANTS in a minute
        self._level_of: dict[str, str] = {}  # blocked_by -> its level, worked out once

    def count(
        self, counts: MinuteCounts, keys: Mapping[str, str], decision: Decision, cost: float, embedded: bool = False
    ) -> None:
        """Count one decision: for its tenant and user, for a denial its blocked_by and the
        key at the blocking level, and its shadow rules and soft quotas gone over; `cost`
        counts as taken when it was allowed. `embedded`: a Django app decided it in its own
        view (counted in the minute's totals, apart)."""
        counts.decisions += 1
        if embedded:
            counts.embedded += 1
            if not decision.allowed:
                counts.embedded_denied += 1
        team = keys.get(self.tenant_level)
        tenant: TenantCounts | None = None
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
            counts.count_shadow(decision.shadow_blocked)
            if tenant is not None:
                tenant.count_shadow(decision.shadow_blocked)
        if decision.over_quota:
            counts.count_over_quota(decision.over_quota)
            if tenant is not None:
                tenant.count_over_quota(decision.over_quota)

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
                tenant.users = top_users(users, self.user_top_k)
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
                counts.tenants_denied = top(denied, self.top_k)
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
            level = self._level_of[blocked_by] = blocking_level(blocked_by)
        key = keys.get(level)
        if key is None:
            return
        # A user is always its team's: "shared" in two teams is two users.
        denied_key: Key = (key, team) if level == self.user_level else key
        by_key = counts.keys.get(level)
        if by_key is None:
            by_key = counts.keys[level] = {}
        by_key[denied_key] = by_key.get(denied_key, 0) + 1
        if len(by_key) >= self._buffer_cap:
            counts.keys[level] = top(by_key, self.top_k)


def blocking_level(blocked_by: str) -> str:
    """The level of a `blocked_by` ("level: rule")."""
    return blocked_by.partition(": ")[0]


def add_into(into: dict[K, int], counts: Mapping[K, int]) -> dict[K, int]:
    """Add `counts` to `into`, name by name; `into` is returned."""
    for name, n in counts.items():
        into[name] = into.get(name, 0) + n
    return into


def top(counts: Mapping[K, int], k: int) -> dict[K, int]:
    """The k largest counts; ties keep the greater key, as Redis's rank order does."""
    return dict(heapq.nlargest(k, counts.items(), key=lambda item: (item[1], _sortable(item[0]))))


def _sortable(key: Key) -> str | tuple[str, str]:
    return key if isinstance(key, str) else (key[0], key[1] or "")


def trimmed(counts: dict[K, int], k: int) -> dict[K, int]:
    """`counts`, or its k largest when it holds more."""
    return counts if len(counts) <= k else top(counts, k)


def top_users(users: Mapping[str, list[int]], k: int) -> dict[str, list[int]]:
    """The k most denied and the k most active users (both top sets are kept)."""
    chosen = set(heapq.nlargest(k, users, key=lambda u: (users[u][1], u)))
    chosen.update(heapq.nlargest(k, users, key=lambda u: (users[u][0], u)))
    return {user: users[user] for user in chosen}
