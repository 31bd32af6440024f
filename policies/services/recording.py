"""What every decision leaves behind: the Prometheus metrics, the decision statistics and the
decision record.

All three are in-process and cheap (no I/O on the decision's path). The statistics and the
record are the process's (policies.telemetry), flushed to the shared store off the decision's
path, so every worker's counts add up in `/api/v1/stats/blocked`,
`/api/v1/tenants/{key}/usage`, the console and the what-if replay.

Every path that decides calls one function here per decision, and nothing else: `record`
(a decision), `record_embedded` (a decision of a Django app's own view, policies.embedding),
`record_many` (a batch), `record_reservation` (a reservation asked for, allowed
or not), `reservation_settled` (committed or cancelled) and `record_release` (a concurrency
lease handed back). A new path (a forward-auth endpoint, a gRPC service) calls the same ones
with the keys, cost and priority it decided, so that its traffic is counted and replayable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from core import Decision

from ..metrics import (
    DECISION_SECONDS,
    DECISIONS,
    EMBEDDED_DECISIONS,
    OVER_QUOTA,
    RESERVATIONS,
    SHADOW_DENIALS,
    STORE_ERRORS,
)
from ..telemetry import decision_recorder, denial_stats

_ALLOWED = DECISIONS.labels("allowed", "", "OK")
# What the record and the metrics call a decision made in a Django app's own view.
EMBEDDED = "embedded"
_DEGRADED_ALLOWED = DECISIONS.labels("allowed", "", "STORE_UNAVAILABLE")


def record(keys: Mapping[str, str], decision: Decision, cost: float = 1, priority: str | None = None) -> None:
    """Count a decision in the metrics and the statistics, and record it for the what-if
    (`cost`: what it asked to take; `priority`: its priority class, None for none)."""
    _count(keys, decision, cost)
    recorder = decision_recorder()
    if recorder is not None:
        recorder.decision(keys, cost, priority, decision)


_EMBEDDED: dict[tuple[str, bool], Any] = {}  # the counter's child per (face, allowed)


def record_embedded(
    keys: Mapping[str, str], decision: Decision, cost: float, face: str, replayable: bool = True
) -> None:
    """`record` for a decision made in a Django app's own view (`face`: decorator,
    middleware or throttle), marked as embedded in the metrics and the record. Only a
    decision under the console's policies is `replayable`: an inline limit's (`rate="10/s"`)
    is counted, but no draft policy could replay it."""
    _count(keys, decision, cost, embedded=True)
    counter = _EMBEDDED.get((face, decision.allowed))
    if counter is None:
        counter = _EMBEDDED[face, decision.allowed] = EMBEDDED_DECISIONS.labels(
            face, "allowed" if decision.allowed else "denied"
        )
    counter.inc()
    recorder = decision_recorder() if replayable else None
    if recorder is not None:
        recorder.decision(keys, cost, None, decision, via=EMBEDDED)


def record_reservation(
    keys: Mapping[str, str],
    decision: Decision,
    cost: float,
    priority: str | None,
    hold: float | None,
    reservation_id: str | None,
) -> None:
    """`record` for a reservation asked for with an estimated `cost` and `hold`;
    `reservation_id` is None when nothing was reserved."""
    _count(keys, decision, cost)
    recorder = decision_recorder()
    if recorder is not None:
        recorder.reservation(keys, cost, priority, hold, decision, reservation_id)


def record_release(keys: Mapping[str, str], lease: str) -> None:
    """A concurrency lease handed back before it ran out (the what-if hands it back too)."""
    recorder = decision_recorder()
    if recorder is not None:
        recorder.release(keys, lease)


def _count(keys: Mapping[str, str], decision: Decision, cost: float, embedded: bool = False) -> None:
    if decision.allowed:
        (_DEGRADED_ALLOWED if decision.degraded else _ALLOWED).inc()
    else:
        DECISIONS.labels("denied", blocking_level(decision), decision.reason).inc()
    if decision.degraded:
        STORE_ERRORS.inc()
    if decision.shadow_blocked:
        for name in decision.shadow_blocked:
            SHADOW_DENIALS.labels(*_level_and_rule(name)).inc()
    if decision.over_quota:
        for name in decision.over_quota:
            OVER_QUOTA.labels(*_level_and_rule(name)).inc()
    denial_stats().record(keys, decision, cost, embedded)


def record_many(decided: Iterable[tuple[Mapping[str, str], Decision, float, str | None]]) -> None:
    """`record` for each `(keys, decision, cost, priority)` of a batch, with one increment per
    counter and label set: in multiprocess mode each `inc()` takes a lock and writes the mmap'd
    file, which was 1.5 us a decision, most of a batch's bookkeeping."""
    stats = denial_stats()
    recorder = decision_recorder()
    allowed = degraded_allowed = degraded = 0
    denied: dict[tuple[str, str], int] = {}
    shadows: dict[str, int] = {}
    over: dict[str, int] = {}
    for keys, decision, cost, priority in decided:
        if decision.allowed:
            if decision.degraded:
                degraded_allowed += 1
            else:
                allowed += 1
        else:
            labels = (blocking_level(decision), decision.reason)
            denied[labels] = denied.get(labels, 0) + 1
        if decision.degraded:
            degraded += 1
        for name in decision.shadow_blocked:
            shadows[name] = shadows.get(name, 0) + 1
        for name in decision.over_quota:
            over[name] = over.get(name, 0) + 1
        stats.record(keys, decision, cost)
        if recorder is not None:
            recorder.decision(keys, cost, priority, decision)
    for counter, count in ((_ALLOWED, allowed), (_DEGRADED_ALLOWED, degraded_allowed), (STORE_ERRORS, degraded)):
        if count:
            counter.inc(count)
    for (level, reason), count in denied.items():
        DECISIONS.labels("denied", level, reason).inc(count)
    for name, count in shadows.items():
        SHADOW_DENIALS.labels(*_level_and_rule(name)).inc(count)
    for name, count in over.items():
        OVER_QUOTA.labels(*_level_and_rule(name)).inc(count)


_TIMERS: dict[str, Any] = {}  # the histogram's child per endpoint


def observe_seconds(endpoint: str, seconds: float) -> None:
    """One gateway request's time in the view, into `limiter_decision_seconds`."""
    timer = _TIMERS.get(endpoint)
    if timer is None:
        timer = _TIMERS[endpoint] = DECISION_SECONDS.labels(endpoint)
    timer.observe(seconds)


def reservation_opened(reservation_id: str, hold: float) -> None:
    RESERVATIONS.labels("opened").inc()
    denial_stats().reservation_opened(reservation_id, hold)


def reservation_settled(reservation_id: str, event: str, actual_cost: float | None = None) -> None:
    """`event`: committed (with `actual_cost`) or cancelled."""
    RESERVATIONS.labels(event).inc()
    denial_stats().reservation_settled(reservation_id)
    recorder = decision_recorder()
    if recorder is not None:
        recorder.settlement(reservation_id, actual_cost if event == "committed" else None)


def blocking_level(decision: Decision) -> str:
    """The level of the rule that blocked a denial ("" for none)."""
    return decision.blocked_by.split(":", 1)[0] if decision.blocked_by else ""


def _level_and_rule(name: str) -> tuple[str, str]:
    level, _, rule = name.partition(": ")
    return level, rule
