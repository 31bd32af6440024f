"""Reading the statistics back: a window's report (totals, blocked_by, the most denied tenants
and keys, a series), a tenant's usage over time, and the users seen recently.

Top keys, tenants and users are approximate once a bucket (a minute or an hour) held more
than `top_k` (users: `user_top_k`) of them: a cut loses at most 1/(top_k + 1) of the bucket's
count, and a count is never too high. A bucket with at most top_k entries is exact. Totals,
blocked_by, the shadow and over-quota counts and every tenant's series are exact (at least
once: a flush whose reply is lost after Redis ran it is sent again).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypedDict

from ..errors import StoreUnavailable
from .counts import Counts, add_into, blocking_level
from .layout import (
    DAY,
    HOUR,
    MINUTE,
    QUARTER,
    SEEN_USERS,
    Bounds,
    StatsKeys,
    breakdown,
    floor,
    latest_tier,
    points,
    scores,
    seen_pattern,
    text,
    totals_from,
    user_of,
)


class SeriesPoint(TypedDict):
    at: int
    decisions: int
    denied: int
    shadow_denied: int
    over_quota: int
    embedded: int
    embedded_denied: int
    blocked_by: dict[str, int]


# Tenants whose minutes one round trip of `denials` reads (a 5-minute window: 1 or 2 hashes each).
DENIALS_BATCH = 500


class StatsReader:
    """Reads what every worker flushed to `client` (a redis-py client, or the in-process
    store); the store's `errors` are raised as StoreUnavailable."""

    def __init__(
        self, client: Any, keys: StatsKeys, bounds: Bounds, user_level: str, errors: tuple[type[Exception], ...]
    ) -> None:
        self.client, self.keys, self.bounds, self.user_level = client, keys, bounds, user_level
        self._errors = errors
        self._levels: set[str] = set()  # levels known to have top-key sets

    def know_levels(self, levels: Iterable[str]) -> None:
        """Levels whose top-key sets were written: a report reads them in its first round trip."""
        self._levels.update(levels)

    def report(self, window: float, top: int, step: int, now: float) -> dict[str, Any]:
        """The report of the whole minutes that the last `window` seconds touch, at `now`."""
        first, last = floor(now - window, MINUTE), floor(now, MINUTE)
        totals, keys, tenants = self._read_report(range(first, last + MINUTE, MINUTE), _spans(first, last))
        return {
            "window": window,
            "since": first,
            "until": now,
            **_summary(totals, keys, tenants, top, self.user_level),
            "series": _series(totals, first, last, step),
        }

    def _read_report(
        self, minutes: range, spans: list[tuple[int, int]]
    ) -> tuple[dict[int, Counts], dict[str, dict[str, int]], dict[str, int]]:
        """Every minute's totals, the known levels' top keys and the top tenants in one round
        trip; a second only for levels another worker denied at and this one has not seen."""
        sets = self._top_sets(spans, sorted(self._levels))
        pipe = self.client.pipeline(transaction=False)
        for minute in minutes:
            pipe.hgetall(self.keys.totals(minute))
        for name in [*(name for _, name in sets), *(self.keys.top_tenants(span, start) for span, start in spans)]:
            _zrange_all(pipe, name)
        replies = self._read(pipe)
        totals = {minute: totals_from(hash_) for minute, hash_ in zip(minutes, replies) if hash_}
        keys: dict[str, dict[str, int]] = {}
        _add_tops(keys, sets, replies[len(minutes) : len(minutes) + len(sets)])
        tenants = _add_replies({}, replies[len(minutes) + len(sets) :])
        new = sorted({blocking_level(name) for c in totals.values() for name in c.blocked} - self._levels)
        if new:
            sets = self._top_sets(spans, new)
            pipe = self.client.pipeline(transaction=False)
            for _, name in sets:
                _zrange_all(pipe, name)
            _add_tops(keys, sets, self._read(pipe))
            self._levels.update(new)
        return totals, keys, tenants

    def _top_sets(self, spans: list[tuple[int, int]], levels: list[str]) -> list[tuple[str, str]]:
        """(level, set name) of each level's minutes and hours in `spans`."""
        return [(level, self.keys.top_keys(span, start, level)) for level in levels for span, start in spans]

    def usage(self, tenant: str, window: float, step: int, top: int, now: float) -> dict[str, Any]:
        """One tenant's usage per `step` over the last `window` seconds, at `now`."""
        first, last = floor(now - window, step), floor(now, step)
        first_hour = floor(first, HOUR)
        days = range(floor(first_hour, DAY), last + 1, DAY)
        quarters = range(floor(first, QUARTER), last + 1, QUARTER) if step == MINUTE else range(0)
        user_hours = range(max(first_hour, floor(now - self.bounds.usage_minutes, HOUR)), last + 1, HOUR)
        replies = iter(self._read(self._usage_pipe(tenant, quarters, days, user_hours)))
        minute_hashes = [next(replies) for _ in quarters]
        hour_hashes = [next(replies) for _ in days]
        breakdowns = [next(replies) for _ in days]
        decided = _add_replies({}, (next(replies) for _ in user_hours))
        denied = _add_replies({}, (next(replies) for _ in user_hours))
        names = {text(i): text(name) for i, name in next(replies).items()}
        if step == MINUTE:
            found = points(zip(quarters, minute_hashes), MINUTE)
        else:
            found = points(zip(days, hour_hashes), HOUR)
        series = [_usage_point(start, found.get(start, {})) for start in range(first, last + 1, step)]
        rules = breakdown(zip(days, breakdowns), first_hour, names)
        blocked, shadow, over = rules["b"], rules["s"], rules["o"]
        return {
            "tenant": tenant,
            "tier": latest_tier(hour_hashes),
            "window": window,
            "step": step,
            "since": first,
            "until": now,
            "breakdown_since": first_hour,
            "has_traffic": any(point["decisions"] for point in series) or bool(blocked or shadow or over),
            "series": series,
            "blocked_by": _most_first_dict(blocked),
            "shadow_blocked_by": _most_first_dict(shadow),
            "over_quota_by": _most_first_dict(over),
            "top_users": _top_user_rows(decided, denied, top),
        }

    def _usage_pipe(self, tenant: str, quarters: range, days: range, user_hours: range) -> Any:
        """The reads of a tenant's usage, in the order `usage` takes their replies."""
        pipe = self.client.pipeline(transaction=False)
        for quarter in quarters:
            pipe.hgetall(self.keys.tenant_minutes(quarter, tenant))
        for day in days:
            pipe.hgetall(self.keys.tenant_hours(day, tenant))
        for day in days:
            pipe.hgetall(self.keys.tenant_breakdown(day, tenant))
        for hour in user_hours:
            _zrange_all(pipe, self.keys.tenant_users(hour, tenant))
        for hour in user_hours:
            _zrange_all(pipe, self.keys.tenant_denied_users(hour, tenant))
        pipe.hgetall(self.keys.rule_names)
        return pipe

    def denials(self, tenants: Iterable[str], window: float, now: float) -> dict[str, tuple[int, int]]:
        """Each tenant's (decisions, denied) over the last `window` seconds, in whole minutes as
        `usage` counts them; its minutes alone are read, one round trip per DENIALS_BATCH."""
        first, last = floor(now - window, MINUTE), floor(now, MINUTE)
        quarters = range(floor(first, QUARTER), last + 1, QUARTER)
        found: dict[str, tuple[int, int]] = {}
        tenants = list(tenants)
        for at in range(0, len(tenants), DENIALS_BATCH):
            batch = tenants[at : at + DENIALS_BATCH]
            pipe = self.client.pipeline(transaction=False)
            for tenant in batch:
                for quarter in quarters:
                    pipe.hgetall(self.keys.tenant_minutes(quarter, tenant))
            replies = iter(self._read(pipe))
            for tenant in batch:
                minutes = points(zip(quarters, [next(replies) for _ in quarters]), MINUTE)
                within = [point for start, point in minutes.items() if first <= start <= last]
                found[tenant] = (sum(int(p.get("d", 0)) for p in within), sum(int(p.get("x", 0)) for p in within))
        return found

    def seen_users(self, prefix: str, limit: int) -> list[dict[str, str | None]]:
        """Users seen recently whose key starts with `prefix`, most recent first."""
        with self._reading():
            found = list(self.client.zscan_iter(self.keys.seen, match=seen_pattern(prefix), count=SEEN_USERS))
        found.sort(key=lambda item: -float(item[1]))
        return [{"user": user, "team": team} for user, team in (user_of(m) for m, _ in found[:limit])]

    def _read(self, pipe: Any) -> list[Any]:
        with self._reading():
            return pipe.execute()

    @contextmanager
    def _reading(self) -> Iterator[None]:
        try:
            yield
        except self._errors as error:
            raise StoreUnavailable(f"Redis cannot read the statistics: {error}") from error


def _spans(first: int, last: int) -> list[tuple[int, int]]:
    """(span, start) of the sets a window's top keys are read from: minute sets from `first`
    up to its first whole hour, and hourly sets from there to `last` (the current hour holds
    nothing after now)."""
    first_hour = first if first % HOUR == 0 else first - first % HOUR + HOUR
    edge = range(first, min(first_hour, last + MINUTE), MINUTE)
    return [(MINUTE, minute) for minute in edge] + [(HOUR, hour) for hour in range(first_hour, last + 1, HOUR)]


def _zrange_all(pipe: Any, name: str) -> None:
    pipe.zrange(name, 0, -1, withscores=True)


def _add_tops(keys: dict[str, dict[str, int]], sets: list[tuple[str, str]], replies: list[Any]) -> None:
    """Add ZRANGE replies, in the order of `sets`, to each level's key counts."""
    for (level, _), reply in zip(sets, replies):
        if reply:
            add_into(keys.setdefault(level, {}), scores(reply))


def _add_replies(into: dict[str, int], replies: Iterable[Any]) -> dict[str, int]:
    for reply in replies:
        add_into(into, scores(reply))
    return into


# --- the answers' shape -----------------------------------------------------------------------


def _summary(
    totals: Mapping[int, Counts],
    keys: Mapping[str, Mapping[str, int]],
    tenants: Mapping[str, int],
    top: int,
    user_level: str,
) -> dict[str, Any]:
    blocked: dict[str, int] = {}
    shadow: dict[str, int] = {}
    over: dict[str, int] = {}
    for counts in totals.values():
        add_into(blocked, counts.blocked)
        add_into(shadow, counts.shadow_by)
        add_into(over, counts.over_quota_by)
    return {
        "decisions": sum(counts.decisions for counts in totals.values()),
        "denied": sum(counts.denied for counts in totals.values()),
        "shadow_denied": sum(counts.shadow for counts in totals.values()),
        "over_quota": sum(counts.over_quota for counts in totals.values()),
        "embedded": sum(counts.embedded for counts in totals.values()),
        "embedded_denied": sum(counts.embedded_denied for counts in totals.values()),
        "blocked_by": _by_rule(blocked),
        "shadow_blocked_by": _by_rule(shadow),
        "over_quota_by": _by_rule(over),
        "top_tenants": [
            {"tenant": tenant, "denied": n} for tenant, n in sorted(tenants.items(), key=_most_first)[:top]
        ],
        "top_keys": {
            level: [_key_row(key, n, level == user_level) for key, n in sorted(by_key.items(), key=_most_first)[:top]]
            for level, by_key in sorted(keys.items())
        },
    }


def _by_rule(counts: Mapping[str, int]) -> list[dict[str, Any]]:
    return [
        {"blocked_by": name, "level": blocking_level(name), "denied": n}
        for name, n in sorted(counts.items(), key=_most_first)
    ]


def _key_row(key: str, denied: int, is_user: bool) -> dict[str, Any]:
    if not is_user:
        return {"key": key, "denied": denied}
    try:
        user, team = user_of(key)
    except (ValueError, TypeError):  # written before users carried their team
        user, team = key, None
    return {"key": user, "team": team, "denied": denied}


def _series(totals: Mapping[int, Counts], first: int, last: int, step: int) -> list[SeriesPoint]:
    """One point per `step` (aligned to multiples of it) from `first` to `last`, zeros included."""
    series: dict[int, SeriesPoint] = {
        at: {
            "at": at,
            "decisions": 0,
            "denied": 0,
            "shadow_denied": 0,
            "over_quota": 0,
            "embedded": 0,
            "embedded_denied": 0,
            "blocked_by": {},
        }
        for at in range(first - first % step, last + 1, step)
    }
    for minute, counts in totals.items():
        point = series[minute - minute % step]
        point["decisions"] += counts.decisions
        point["denied"] += counts.denied
        point["shadow_denied"] += counts.shadow
        point["over_quota"] += counts.over_quota
        point["embedded"] += counts.embedded
        point["embedded_denied"] += counts.embedded_denied
        add_into(point["blocked_by"], counts.blocked)
    return list(series.values())


def _usage_point(start: int, counts: Mapping[str, float]) -> dict[str, Any]:
    decisions, denied = counts.get("d", 0), counts.get("x", 0)
    return {
        "start": start,
        "decisions": decisions,
        "allowed": decisions - denied,
        "denied": denied,
        "shadow_denied": counts.get("s", 0),
        "over_quota": counts.get("o", 0),
        "cost": _whole(counts.get("c", 0.0)),
    }


def _whole(value: float) -> float | int:
    """Costs as the caller gave them: 12 rather than 12.0 when whole."""
    return int(value) if float(value).is_integer() else value


def _top_user_rows(decided: Mapping[str, int], denied: Mapping[str, int], top: int) -> list[dict[str, Any]]:
    """The most denied users first, then the most active; a user's decisions are at least
    its denials (its decisions may have been trimmed from an hour's top set)."""
    rows = [(user, max(decided.get(user, 0), denied.get(user, 0)), denied.get(user, 0)) for user in {*denied, *decided}]
    rows.sort(key=lambda row: (-row[2], -row[1], row[0]))
    return [{"user": user, "decisions": n, "denied": n_denied} for user, n, n_denied in rows[:top]]


def _most_first_dict(counts: Mapping[str, int]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=_most_first))


def _most_first(item: tuple[str, int]) -> tuple[int, str]:
    return -item[1], item[0]
