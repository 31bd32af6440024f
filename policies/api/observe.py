"""What every decision leaves behind: Prometheus counters and the denial statistics.

Both are in-process and cheap (no I/O on the decision's path). The statistics are pushed
to the shared store in one pipeline about once a second (core.stats.DenialStats), so every
worker's denials add up in `/api/v1/stats/blocked` and the dashboard.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from functools import lru_cache

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, generate_latest, multiprocess  # noqa: F401  (re-exported for the view)

from core import Decision

DECISIONS = Counter(
    "limiter_decisions", "Decisions made, by result, blocking level and reason.", ["result", "level", "reason"]
)
STORE_ERRORS = Counter("limiter_store_unavailable", "Decisions a level's fail mode made: the store was down.")

_ALLOWED = DECISIONS.labels("allowed", "", "OK")
_DEGRADED_ALLOWED = DECISIONS.labels("allowed", "", "STORE_UNAVAILABLE")


def record(keys: Mapping[str, str], decision: Decision) -> None:
    if decision.allowed:
        (_DEGRADED_ALLOWED if decision.degraded else _ALLOWED).inc()
    else:
        DECISIONS.labels("denied", _blocking_level(decision), decision.reason).inc()
    if decision.degraded:
        STORE_ERRORS.inc()
    denial_stats().record(keys, decision)


def record_many(decided: Iterable[tuple[Mapping[str, str], Decision]]) -> None:
    """`record` for each `(keys, decision)` of a batch, with one increment per counter and
    label set: in multiprocess mode each `inc()` takes a lock and writes the mmap'd file, which
    was 1.5 us a decision, most of a batch's bookkeeping."""
    stats = denial_stats()
    allowed = degraded_allowed = degraded = 0
    denied: dict[tuple[str, str], int] = {}
    for keys, decision in decided:
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
        stats.record(keys, decision)
    for counter, count in ((_ALLOWED, allowed), (_DEGRADED_ALLOWED, degraded_allowed), (STORE_ERRORS, degraded)):
        if count:
            counter.inc(count)
    for (level, reason), count in denied.items():
        DECISIONS.labels("denied", level, reason).inc(count)


def _blocking_level(decision: Decision) -> str:
    return decision.blocked_by.split(":", 1)[0] if decision.blocked_by else ""


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

    from ..stores import statistics_client

    return DenialStats(client=statistics_client(), prefix=settings.LIMITER_KEY_PREFIX)


def metrics_text() -> bytes:
    """Every worker's counters when gunicorn runs several (PROMETHEUS_MULTIPROC_DIR set),
    else this process's."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest(REGISTRY)
