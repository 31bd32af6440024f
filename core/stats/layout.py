"""Where the statistics live in the store, and how their fields are written and read back.

All keys share the `{stats}` hash tag (`P` is `<prefix>:{stats}`), and each expires once no
window can read it:

    P:m:<minute>            hash   decisions, denied, shadow (decisions a shadow rule would
                                   have denied), over_quota (decisions let go past a soft
                                   quota), by:<blocked_by>, sh:<shadow rule>, oq:<soft quota>,
                                   embedded and embedded_denied (decided in a Django app's
                                   own views, policies.embedding)
    P:k:<minute>:<level>    zset   the most denied keys of a level (users as [user, team])
    P:h:<hour>:<level>      zset   the same, per hour (a 24 h report reads 24, not 1,440)
    P:t:<minute>, P:ht:<hour> zset the most denied tenants, denials at any level
    P:um:<quarter>:<tenant> hash   the tenant's minutes: <i>d decisions, <i>x denied,
                                   <i>s shadow-denied, <i>o over a soft quota, <i>c cost
                                   taken (i: minute 0-14)
    P:uh:<day>:<tenant>     hash   its hours, the same fields (i: hour 0-23), and t: its tier
    P:ub:<day>:<tenant>     hash   <h>b<rule id> (denials), <h>s<rule id> (shadow) and
                                   <h>o<rule id> (over a soft quota) per hour
    P:rules, P:rule-names   hash   rule name -> short id, and back (every worker's the same)
    P:uu:<hour>:<tenant>, P:ux:<hour>:<tenant>  zset  its most active and most denied users
    P:seen                  zset   recently seen users ([user, team]), score: when
    P:res                   zset   open reservations, score: when they expire

A tenant's minutes live in one hash per quarter hour (at most 75 fields: Redis's compact
listpack encoding, which holds up to 128 by default) and its hours in one per day (at most
121), because a key costs about 100 bytes of its own: docs/OPERATIONS.md gives the memory
bound and its measured figures.
Zero counts are not written. One `{stats}` hash tag makes a flush one MULTI/EXEC on one
node; on Redis Cluster that is one slot for all statistics.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from .counts import Counts, Key, TenantCounts

MINUTE, HOUR, DAY = 60, 3600, 86400
QUARTER = 15 * MINUTE  # a tenant's minutes are kept in one hash per quarter hour
# Keys outlive the last window that can read them by this much (clock skew between workers).
TTL_SLACK = 60
# Recently seen users kept for search, most recent first.
SEEN_USERS = 10_000
DECISIONS, DENIED, SHADOW, BY, SHADOW_BY = "decisions", "denied", "shadow", "by:", "sh:"
OVER_QUOTA, OVER_QUOTA_BY = "over_quota", "oq:"
EMBEDDED, EMBEDDED_DENIED = "embedded", "embedded_denied"
# A tenant series' fields: decisions, denied, shadow-denied, over a soft quota, cost.
SERIES_FIELDS = {"d": "decisions", "x": "denied", "s": "shadow_denied", "o": "over_quota", "c": "cost"}
# A tenant breakdown's kinds of rule: blocked_by, shadow rules, soft quotas gone over.
BREAKDOWN_KINDS = ("b", "s", "o")
TIER = "t"  # the field of a tenant's day that names its tier
_TOP_KEYS = {MINUTE: "k", HOUR: "h"}
_TOP_TENANTS = {MINUTE: "t", HOUR: "ht"}


class Bounds(NamedTuple):
    """How much the store keeps: entries per top set, and how long each bucket stays readable."""

    top_k: int
    user_top_k: int
    retention: float  # the totals and top sets a report reads
    usage_minutes: float  # a tenant's minutes and users
    usage_hours: float  # a tenant's hours and blocked_by


class StatsKeys:
    """The name of every statistics key, under `<prefix>:{stats}`."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.seen = self._name("seen")
        self.rules = self._name("rules")
        self.rule_names = self._name("rule-names")
        self.rule_seq = self._name("rule-seq")
        self.reservations = self._name("res")

    def _name(self, kind: str, *parts: object) -> str:
        return ":".join((self.prefix, "{stats}", kind, *map(str, parts)))

    def totals(self, minute: int) -> str:
        return self._name("m", minute)

    def top_keys(self, span: int, start: int, level: str) -> str:
        """The most denied keys of `level` in the minute or hour (`span`) from `start`."""
        return self._name(_TOP_KEYS[span], start, level)

    def top_tenants(self, span: int, start: int) -> str:
        """The most denied tenants in the minute or hour (`span`) from `start`."""
        return self._name(_TOP_TENANTS[span], start)

    def tenant_minutes(self, quarter: int, tenant: str) -> str:
        return self._name("um", quarter, tenant)

    def tenant_hours(self, day: int, tenant: str) -> str:
        return self._name("uh", day, tenant)

    def tenant_breakdown(self, day: int, tenant: str) -> str:
        return self._name("ub", day, tenant)

    def tenant_users(self, hour: int, tenant: str) -> str:
        return self._name("uu", hour, tenant)

    def tenant_denied_users(self, hour: int, tenant: str) -> str:
        return self._name("ux", hour, tenant)


def floor(t: float, span: int) -> int:
    """The start of the minute, quarter, hour or day (`span`) that holds `t`."""
    return int(t // span) * span


def ttl(start: int, span: int, now: float, retention: float) -> int:
    """Seconds until no window can read the bucket: relative, so that it follows `clock`."""
    return math.ceil(start + span + retention + TTL_SLACK - now)


def text(value: Any) -> str:
    """A reply as text: Redis answers bytes, the in-process store what it was given."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


# --- users: [user, team] as JSON ---------------------------------------------------------------


def user_member(user: str, team: str | None) -> str:
    return json.dumps([user, team], ensure_ascii=False, separators=(",", ":"))


def user_of(member: Any) -> tuple[str, str | None]:
    user, team = json.loads(text(member))
    return user, team


def members(by_key: Mapping[Key, int]) -> dict[str, int]:
    """Set members as stored: a user level's (user, team) as JSON, other keys as they are."""
    return {user_member(*key) if isinstance(key, tuple) else key: n for key, n in by_key.items()}


def seen_pattern(prefix: str) -> str:
    """A ZSCAN MATCH glob for the seen users whose key starts with `prefix`."""
    return _glob_escape("[" + json.dumps(prefix, ensure_ascii=False)[:-1]) + "*"


def _glob_escape(pattern: str) -> str:
    return "".join("\\" + c if c in "*?[]\\^-" else c for c in pattern)


def scores(reply: Iterable[tuple[Any, Any]] | None) -> dict[str, int]:
    """A ZRANGE ... WITHSCORES reply as {member: count}."""
    return {text(key): int(score) for key, score in reply or ()}


# --- a minute's totals: P:m:<minute> -------------------------------------------------------------


def queue_totals(pipe: Any, name: str, counts: Counts, ttl: int) -> None:
    pipe.hincrby(name, DECISIONS, counts.decisions)
    pipe.hincrby(name, DENIED, counts.denied)
    if counts.shadow:
        pipe.hincrby(name, SHADOW, counts.shadow)
    for blocked_by, n in counts.blocked.items():
        pipe.hincrby(name, BY + blocked_by, n)
    for rule, n in counts.shadow_by.items():
        pipe.hincrby(name, SHADOW_BY + rule, n)
    if counts.over_quota:
        pipe.hincrby(name, OVER_QUOTA, counts.over_quota)
    for rule, n in counts.over_quota_by.items():
        pipe.hincrby(name, OVER_QUOTA_BY + rule, n)
    if counts.embedded:
        pipe.hincrby(name, EMBEDDED, counts.embedded)
    if counts.embedded_denied:
        pipe.hincrby(name, EMBEDDED_DENIED, counts.embedded_denied)
    pipe.expire(name, ttl)


def totals_from(hash_: Mapping[Any, Any]) -> Counts:
    counts = Counts()
    for field, value in hash_.items():
        field, n = text(field), int(value)
        if field == DECISIONS:
            counts.decisions = n
        elif field == DENIED:
            counts.denied = n
        elif field == SHADOW:
            counts.shadow = n
        elif field == OVER_QUOTA:
            counts.over_quota = n
        elif field == EMBEDDED:
            counts.embedded = n
        elif field == EMBEDDED_DENIED:
            counts.embedded_denied = n
        elif field.startswith(BY):
            counts.blocked[field[len(BY) :]] = n
        elif field.startswith(SHADOW_BY):
            counts.shadow_by[field[len(SHADOW_BY) :]] = n
        elif field.startswith(OVER_QUOTA_BY):
            counts.over_quota_by[field[len(OVER_QUOTA_BY) :]] = n
    return counts


# --- a tenant's series (P:um, P:uh), tier (P:uh) and breakdown (P:ub) -----------------------------


def queue_series(pipe: Any, name: str, index: int, usage: TenantCounts, ttl: int) -> None:
    pipe.hincrby(name, f"{index}d", usage.decisions)
    if usage.denied:
        pipe.hincrby(name, f"{index}x", usage.denied)
    if usage.shadow:
        pipe.hincrby(name, f"{index}s", usage.shadow)
    if usage.over_quota:
        pipe.hincrby(name, f"{index}o", usage.over_quota)
    if usage.cost:
        pipe.hincrbyfloat(name, f"{index}c", usage.cost)
    pipe.expire(name, ttl)


def points(buckets: Iterable[tuple[int, Mapping[Any, Any] | None]], span: int) -> dict[int, dict[str, float]]:
    """A series hash per quarter (or day) -> the counts of each minute (or hour) in it."""
    found: dict[int, dict[str, float]] = {}
    for start, hash_ in buckets:
        for raw, value in (hash_ or {}).items():
            field = text(raw)
            index, kind = field[:-1], field[-1:]
            if index.isdigit() and kind in SERIES_FIELDS:
                point = found.setdefault(start + int(index) * span, {})
                point[kind] = float(value) if kind == "c" else int(value)
    return found


def latest_tier(days: list[Mapping[Any, Any] | None]) -> str | None:
    for hash_ in reversed(days):
        for field, value in (hash_ or {}).items():
            if text(field) == TIER:
                return text(value)
    return None


def queue_breakdown(pipe: Any, name: str, index: int, usage: TenantCounts, ids: Mapping[str, str], ttl: int) -> None:
    for blocked_by, n in usage.blocked.items():
        pipe.hincrby(name, f"{index}b{ids[blocked_by]}", n)
    for rule, n in usage.shadow_by.items():
        pipe.hincrby(name, f"{index}s{ids[rule]}", n)
    for rule, n in usage.over_quota_by.items():
        pipe.hincrby(name, f"{index}o{ids[rule]}", n)
    pipe.expire(name, ttl)


def breakdown(
    days: Iterable[tuple[int, Mapping[Any, Any] | None]], since: int, names: Mapping[str, str]
) -> dict[str, dict[str, int]]:
    """Each kind of BREAKDOWN_KINDS -> its rules (by their ids' `names`) and counts, from the
    hours at or after `since`."""
    found: dict[str, dict[str, int]] = {kind: {} for kind in BREAKDOWN_KINDS}
    for day, hash_ in days:
        for raw, value in (hash_ or {}).items():
            field = text(raw)
            digits = len(field) - len(field.lstrip("0123456789"))
            into = found.get(field[digits : digits + 1])
            if not digits or into is None or day + int(field[:digits]) * HOUR < since:
                continue
            name = names.get(field[digits + 1 :], field[digits + 1 :])
            into[name] = into.get(name, 0) + int(value)
    return found
