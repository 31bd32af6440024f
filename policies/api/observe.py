"""What every decision leaves behind: Prometheus metrics, the decision statistics and the
decision record.

All three are in-process and cheap (no I/O on the decision's path). The statistics are pushed
to the shared store in one pipeline about once a second (core.stats.DenialStats), so every
worker's counts add up in `/api/v1/stats/blocked`, `/api/v1/tenants/{key}/usage` and the
dashboard. The record (core.recorder.DecisionRecorder, `decision_recorder()`) keeps the
recent requests themselves, flushed the same way, for the what-if replay (policies.whatif).

Every path that decides calls one function here per decision, and nothing else: `record`
(a decision), `record_many` (a batch), `record_reservation` (a reservation asked for, allowed
or not), `reservation_settled` (committed or cancelled) and `record_release` (a concurrency
lease handed back). A new path (a forward-auth endpoint, a gRPC service) calls the same ones
with the keys, cost and priority it decided, so that its traffic is counted and replayable.

Metrics: `limiter_decisions_total{result,level,reason}`, `limiter_store_unavailable_total`,
`limiter_shadow_denials_total{level,rule}` (a decision that a shadow rule would have denied,
once per such rule), `limiter_decision_seconds{endpoint}` (the time a gateway's request
took in the view), and `limiter_reservations_total{event}`: opened, committed, cancelled,
and expired. A reservation left open past its expiry is noticed by the statistics' sweep
(every few seconds, EXPIRY_GRACE after the expiry; core/stats.py) and counted by the one
worker that removes it from the shared set of open reservations.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from prometheus_client import (  # noqa: F401  (CONTENT_TYPE_LATEST: re-exported for the view)
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)

from core import Decision
from core.recorder import DecisionRecorder

DECISIONS = Counter(
    "limiter_decisions", "Decisions made, by result, blocking level and reason.", ["result", "level", "reason"]
)
STORE_ERRORS = Counter("limiter_store_unavailable", "Decisions a level's fail mode made: the store was down.")
SHADOW_DENIALS = Counter(
    "limiter_shadow_denials", "Decisions a shadow rule would have denied, by its level and rule.", ["level", "rule"]
)
DECISION_SECONDS = Histogram(
    "limiter_decision_seconds",
    "Seconds a gateway's request spent in the view (decisions, batch, reservations, commit, cancel).",
    ["endpoint"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
)
RESERVATIONS = Counter(
    "limiter_reservations",
    "Reservations by event: opened, committed, cancelled, expired (left open past their expiry).",
    ["event"],
)

_ALLOWED = DECISIONS.labels("allowed", "", "OK")
_DEGRADED_ALLOWED = DECISIONS.labels("allowed", "", "STORE_UNAVAILABLE")


def record(keys: Mapping[str, str], decision: Decision, cost: float = 1, priority: str | None = None) -> None:
    """Count a decision in the metrics and the statistics, and record it for the what-if
    (`cost`: what it asked to take; `priority`: its priority class, None for none)."""
    _count(keys, decision, cost)
    recorder = decision_recorder()
    if recorder is not None:
        recorder.decision(keys, cost, priority, decision)


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


def _count(keys: Mapping[str, str], decision: Decision, cost: float) -> None:
    if decision.allowed:
        (_DEGRADED_ALLOWED if decision.degraded else _ALLOWED).inc()
    else:
        DECISIONS.labels("denied", _blocking_level(decision), decision.reason).inc()
    if decision.degraded:
        STORE_ERRORS.inc()
    if decision.shadow_blocked:
        for name in decision.shadow_blocked:
            SHADOW_DENIALS.labels(*_level_and_rule(name)).inc()
    denial_stats().record(keys, decision, cost)


def record_many(decided: Iterable[tuple[Mapping[str, str], Decision, float, str | None]]) -> None:
    """`record` for each `(keys, decision, cost, priority)` of a batch, with one increment per
    counter and label set: in multiprocess mode each `inc()` takes a lock and writes the mmap'd
    file, which was 1.5 us a decision, most of a batch's bookkeeping."""
    stats = denial_stats()
    recorder = decision_recorder()
    allowed = degraded_allowed = degraded = 0
    denied: dict[tuple[str, str], int] = {}
    shadows: dict[str, int] = {}
    for keys, decision, cost, priority in decided:
        if decision.allowed:
            if decision.degraded:
                degraded_allowed += 1
            else:
                allowed += 1
        else:
            labels = (_blocking_level(decision), decision.reason)
            denied[labels] = denied.get(labels, 0) + 1
        if decision.degraded:
            degraded += 1
        for name in decision.shadow_blocked:
            shadows[name] = shadows.get(name, 0) + 1
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


def _blocking_level(decision: Decision) -> str:
    return decision.blocked_by.split(":", 1)[0] if decision.blocked_by else ""


def _level_and_rule(name: str) -> tuple[str, str]:
    level, _, rule = name.partition(": ")
    return level, rule


_installed = None


def denial_stats():
    """The process's denial statistics, on the limiter's Redis when there is one."""
    return _installed if _installed is not None else _default_denial_stats()


def install_denial_stats(stats) -> None:
    """Make `stats` the process's denial statistics (None: back to the default); for tests."""
    global _installed
    _installed = stats


@lru_cache(maxsize=1)
def _default_denial_stats():
    """On the `default` Redis pool, not the limiter's: a 24 h report reads ~1,500 keys and
    may take longer than the 50 ms a decision is allowed to wait."""
    from django.conf import settings

    from core.stats import DenialStats

    from ..compile import TENANT_LEVEL, USER_LEVEL
    from ..stores import statistics_client

    return DenialStats(
        client=statistics_client(),
        prefix=settings.LIMITER_KEY_PREFIX,
        tenant_level=TENANT_LEVEL,
        user_level=USER_LEVEL,
        usage_minutes=settings.LIMITER_USAGE_MINUTE_HOURS * 3600,
        usage_hours=settings.LIMITER_USAGE_HOUR_DAYS * 86400,
        tier_of=tier_of,
        on_expired=count_expired,
    )


_UNSET = object()
_recorder: Any = _UNSET  # the process's recorder once known (None: recording is off)


def decision_recorder() -> DecisionRecorder | None:
    """The process's decision record (core.recorder), on the statistics' Redis when there is
    one; None when LIMITER_RECORD_LIMIT is 0 (recording off: nothing is kept, nothing costs)."""
    global _recorder
    if _recorder is _UNSET:
        _recorder = _default_recorder()
    return _recorder


def install_decision_recorder(recorder: DecisionRecorder | None) -> None:
    """Make `recorder` the process's decision record (None: recording off); for tests.
    `reset_decision_recorder()` goes back to what the settings say."""
    global _recorder
    _recorder = recorder


def reset_decision_recorder() -> None:
    global _recorder
    _recorder = _UNSET


def _default_recorder() -> DecisionRecorder | None:
    from django.conf import settings

    from ..stores import statistics_client

    if not settings.LIMITER_RECORD_LIMIT:
        return None
    return DecisionRecorder(
        client=statistics_client(), limit=settings.LIMITER_RECORD_LIMIT, prefix=settings.LIMITER_KEY_PREFIX
    )


def count_expired(reservations: int) -> None:
    """The statistics' sweep found reservations left open past their expiry."""
    RESERVATIONS.labels("expired").inc(reservations)


def tier_of(tenant: str) -> str | None:
    """The tier a team key resolves to in the policy this process decides with (no query:
    the statistics ask from their flushing thread)."""
    from ..compile import policy_cache

    policy = policy_cache().policy
    if policy is None:
        return None
    found = policy.tenants.get(tenant)
    return found.tier if found is not None else policy.default_tier


def metrics_text() -> bytes:
    """Every worker's counters when gunicorn runs several (PROMETHEUS_MULTIPROC_DIR set),
    else this process's."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest(REGISTRY)
