"""What-if: recorded decision requests (core.recorder) replayed under two policies.

    result = compare(records, current, draft, start=t0, end=t1, step=60)
    result.tenants["acme"].newly_denied, result.totals.allowed_draft, result.series[0]

A policy here is anything that routes a team key to a limiter, as `policies.compile.Policy`
does: `route(team_key, now)`, `limiter(route, store, clock)` and `next_expiry(now)` (when a
route may change: a tenant's overrides end).

Each policy replays every record on a MemoryStore of its own, through the limiter's public
calls, with a ManualClock set to the record's time. Both start from full buckets at the
window's start, so that the current policy's replay is the baseline and the difference
between the two is the policy change alone, not the state the live buckets happened to be in.
Reservations are reserved with their estimate and their hold, and settled when their
settlement was recorded (with its actual cost, or cancelled); one that the replay allowed
and the real service denied was never settled, so it holds its cost until its hold runs out.
A concurrency lease that a decision took is handed back when its release was recorded.
A request that a policy cannot decide at all (it names a level or priority class that the
policy does not have) counts as denied, blocked by REFUSED.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .clock import ManualClock
from .errors import InvalidRequest, ReservationNotFound, ReservationSettled
from .limiter import HierarchicalLimiter
from .recorder import DECISION, RELEASE, SETTLEMENT, Record
from .stores import MemoryStore, Store

REFUSED = "(refused: the policy cannot decide it)"
NO_RULE = "(no rule)"  # a denial that names no rule
# How often (in records) a long replay reports its progress.
PROGRESS_EVERY = 10_000


class Routing(Protocol):
    """What a replay needs of a policy (policies.compile.Policy has it)."""

    def route(self, team_key: str | None, now: float) -> Hashable: ...

    def limiter(self, route: Any, store: Store, clock: Callable[[], float] | None) -> HierarchicalLimiter: ...

    def next_expiry(self, now: float) -> float: ...


@dataclass
class TenantImpact:
    """One tenant's decisions (or all of them) under both policies."""

    decisions: int = 0
    denied_now: int = 0
    denied_draft: int = 0
    newly_denied: int = 0
    newly_allowed: int = 0
    blocked_by_now: dict[str, int] = field(default_factory=dict)
    blocked_by_draft: dict[str, int] = field(default_factory=dict)

    @property
    def allowed_now(self) -> int:
        return self.decisions - self.denied_now

    @property
    def allowed_draft(self) -> int:
        return self.decisions - self.denied_draft

    def add(self, other: TenantImpact) -> None:
        self.decisions += other.decisions
        self.denied_now += other.denied_now
        self.denied_draft += other.denied_draft
        self.newly_denied += other.newly_denied
        self.newly_allowed += other.newly_allowed
        for mine, theirs in (
            (self.blocked_by_now, other.blocked_by_now),
            (self.blocked_by_draft, other.blocked_by_draft),
        ):
            for name, count in theirs.items():
                mine[name] = mine.get(name, 0) + count


@dataclass
class Point:
    """Decisions, and denials under each policy, in one step of the window."""

    start: float
    decisions: int = 0
    denied_now: int = 0
    denied_draft: int = 0


@dataclass
class Comparison:
    """Per tenant (by team key; requests without one only in the totals), in all, and over time."""

    tenants: dict[str, TenantImpact]
    totals: TenantImpact
    series: list[Point]
    replayed: int  # records replayed, under each policy: decisions, reservations, settlements, releases


def compare(
    records: Sequence[Record],
    current: Routing,
    draft: Routing,
    start: float,
    end: float,
    step: float,
    tenant_level: str = "team",
    progress: Callable[[int, int], None] | None = None,
) -> Comparison:
    """Replay `records` (oldest first, from `start` to `end`) under `current` and under
    `draft`, and count per tenant, in all, and per `step` seconds what each allowed.
    `progress(done, total)` is told every PROGRESS_EVERY records of the two replays."""
    total = 2 * len(records)

    def told(offset: int) -> Callable[[int], None] | None:
        return None if progress is None else lambda done: progress(offset + done, total)

    now_outcomes = replay(records, current, start, tenant_level, told(0))
    draft_outcomes = replay(records, draft, start, tenant_level, told(len(records)))
    result = _count(records, now_outcomes, draft_outcomes, start, end, step, tenant_level)
    if progress is not None:
        progress(total, total)
    return result


def replay(
    records: Sequence[Record],
    policy: Routing,
    start: float,
    tenant_level: str = "team",
    progress: Callable[[int], None] | None = None,
) -> list[str | None]:
    """Each record's outcome under `policy`, from full buckets at `start`: None when allowed,
    else what blocked it (settlements and releases: None, they decide nothing)."""
    clock = ManualClock(start)
    store = MemoryStore()
    limiters: dict[Hashable, HierarchicalLimiter] = {}
    by_team: dict[str | None, HierarchicalLimiter] = {}
    routes_change_at = policy.next_expiry(start)
    reserved: dict[str, tuple[HierarchicalLimiter, str]] = {}  # recorded id -> limiter, replayed id
    leases: dict[str, tuple[HierarchicalLimiter, Mapping[str, str], str]] = {}  # recorded -> replayed lease
    outcomes: list[str | None] = []
    append = outcomes.append
    for i, record in enumerate(records):
        at = record.time
        clock.now = at
        if at >= routes_change_at:  # a tenant's overrides ended: route every team key afresh
            by_team.clear()
            routes_change_at = policy.next_expiry(at)
        kind = record.kind
        if kind == SETTLEMENT or kind == RELEASE:
            _apply(record, reserved, leases)
            append(None)
            continue
        keys = record.keys
        team = keys.get(tenant_level)
        limiter = by_team.get(team)
        if limiter is None:
            route = policy.route(team, at)
            limiter = limiters.get(route)
            if limiter is None:
                limiter = limiters[route] = policy.limiter(route, store, clock)
            by_team[team] = limiter
        cost = record.cost
        assert cost is not None, "only a settlement (a cancel) has no cost"
        try:
            if kind == DECISION:
                decision = limiter.acquire(keys, cost, record.priority)
                if decision.lease is not None and record.ref is not None:
                    leases[record.ref] = (limiter, keys, decision.lease)
            else:
                decision, reservation = limiter.reserve(keys, cost, record.priority, record.hold)
                if reservation is not None and record.ref is not None:
                    reserved[record.ref] = (limiter, reservation.id)
        except InvalidRequest:
            append(REFUSED)
        else:
            append(None if decision.allowed else decision.blocked_by or NO_RULE)
        if progress is not None and i % PROGRESS_EVERY == PROGRESS_EVERY - 1:
            progress(i + 1)
    return outcomes


def _apply(record: Record, reserved: dict, leases: dict) -> None:
    """A settlement or a release, on the replay's own reservation or lease, if it made one."""
    if record.kind == SETTLEMENT:
        found = reserved.pop(record.ref, None)
        if found is not None:
            limiter, reservation_id = found
            try:
                limiter.settle(reservation_id, record.cost)
            except (ReservationNotFound, ReservationSettled):
                pass  # its hold ran out in the replay first: as the service would have answered
    else:
        taken = leases.pop(record.ref, None)
        if taken is not None:
            limiter, keys, lease = taken
            limiter.release(keys, lease)


def _count(
    records: Sequence[Record],
    now_outcomes: list[str | None],
    draft_outcomes: list[str | None],
    start: float,
    end: float,
    step: float,
    tenant_level: str,
) -> Comparison:
    points = max(1, math.ceil((end - start) / step))
    series = [Point(start + i * step) for i in range(points)]
    last = points - 1
    impacts: dict[str | None, TenantImpact] = {}  # None: the requests that name no tenant
    for record, now, draft in zip(records, now_outcomes, draft_outcomes):
        kind = record.kind
        if kind == SETTLEMENT or kind == RELEASE:
            continue
        index = int((record.time - start) // step)
        point = series[last if index > last else 0 if index < 0 else index]
        point.decisions += 1
        team = record.keys.get(tenant_level)
        impact = impacts.get(team)
        if impact is None:
            impact = impacts[team] = TenantImpact()
        impact.decisions += 1
        if now is None and draft is None:
            continue  # allowed under both: most records, counted by `decisions` alone
        if now is not None:
            point.denied_now += 1
            impact.denied_now += 1
            impact.blocked_by_now[now] = impact.blocked_by_now.get(now, 0) + 1
            if draft is None:
                impact.newly_allowed += 1
        if draft is not None:
            point.denied_draft += 1
            impact.denied_draft += 1
            impact.blocked_by_draft[draft] = impact.blocked_by_draft.get(draft, 0) + 1
            if now is None:
                impact.newly_denied += 1
    totals = TenantImpact()
    for impact in impacts.values():
        totals.add(impact)
    impacts.pop(None, None)
    return Comparison(impacts, totals, series, len(records))  # type: ignore[arg-type]  # None popped


__all__ = ["NO_RULE", "REFUSED", "Comparison", "Point", "Routing", "TenantImpact", "compare", "replay"]
