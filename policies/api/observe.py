"""What every decision leaves behind: Prometheus counters and the denial statistics.

Both are in-process and cheap (no I/O on the decision's path). The statistics are pushed
to the shared store in one pipeline about once a second (core.stats.DenialStats), so every
worker's denials add up in `/api/v1/stats/blocked` and the dashboard.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Mapping

from prometheus_client import CollectorRegistry, Counter, generate_latest, multiprocess
from prometheus_client import REGISTRY, CONTENT_TYPE_LATEST  # noqa: F401  (re-exported for the view)

from core import Decision

DECISIONS = Counter("limiter_decisions", "Decisions made, by result, blocking level and reason.",
                    ["result", "level", "reason"])
STORE_ERRORS = Counter("limiter_store_unavailable", "Decisions a level's fail mode made: the store was down.")

_ALLOWED = DECISIONS.labels("allowed", "", "OK")
_DEGRADED_ALLOWED = DECISIONS.labels("allowed", "", "STORE_UNAVAILABLE")


def record(keys: Mapping[str, str], decision: Decision) -> None:
    if decision.allowed:
        (_DEGRADED_ALLOWED if decision.degraded else _ALLOWED).inc()
    else:
        level = decision.blocked_by.split(":", 1)[0] if decision.blocked_by else ""
        DECISIONS.labels("denied", level, decision.reason).inc()
    if decision.degraded:
        STORE_ERRORS.inc()
    denial_stats().record(keys, decision)


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
