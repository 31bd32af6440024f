"""What every decision leaves behind: Prometheus metrics and the decision statistics.

Both are in-process and cheap (no I/O on the decision's path). The statistics are pushed
to the shared store in one pipeline about once a second (core.stats.DenialStats), so every
worker's counts add up in `/api/v1/stats/blocked`, `/api/v1/tenants/{key}/usage` and the
dashboard.

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


def record(keys: Mapping[str, str], decision: Decision, cost: float = 1) -> None:
    """Count a decision in the metrics and the statistics (`cost`: what it asked to take)."""
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


def record_many(decided: Iterable[tuple[Mapping[str, str], Decision, float]]) -> None:
    """`record` for each `(keys, decision, cost)` of a batch, with one increment per counter and
    label set: in multiprocess mode each `inc()` takes a lock and writes the mmap'd file, which
    was 1.5 us a decision, most of a batch's bookkeeping."""
    stats = denial_stats()
    allowed = degraded_allowed = degraded = 0
    denied: dict[tuple[str, str], int] = {}
    shadows: dict[str, int] = {}
    for keys, decision, cost in decided:
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


def reservation_settled(reservation_id: str, event: str) -> None:
    """`event`: committed or cancelled."""
    RESERVATIONS.labels(event).inc()
    denial_stats().reservation_settled(reservation_id)


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
