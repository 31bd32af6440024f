"""The process's decision statistics and decision record, built once from the settings.

The statistics (core.stats.DenialStats) count every decision by rule, tenant and user, and
keep each tenant's traffic over time; the record (core.recorder.DecisionRecorder) keeps the
recent requests themselves for the what-if replay. Both buffer in process and are flushed to
the shared store off the decision's path (core.flusher), so every worker's counts add up.
Tests install their own (`install_denial_stats`, `install_decision_recorder`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

from django.conf import settings

from core.flusher import FLUSHER
from core.recorder import DecisionRecorder
from core.stats import DenialStats

from .compile import policy_cache
from .metrics import count_expired, count_flush
from .policy import TENANT_LEVEL, USER_LEVEL
from .stores import statistics_client

_installed: DenialStats | None = None
FLUSHER.on_flushed = count_flush  # the flushes' CPU, in /metrics
# Told the tenants (team keys) of each flush of the process's statistics, in the flushing
# thread: the alerts' evaluation (policies.services.alerts) listens.
_flush_listeners: list[Callable[[frozenset[str]], None]] = []


def denial_stats() -> DenialStats:
    """The process's denial statistics, on the limiter's Redis when there is one."""
    return _installed if _installed is not None else _default_denial_stats()


def install_denial_stats(stats: DenialStats | None) -> None:
    """Make `stats` the process's denial statistics (None: back to the default); for tests."""
    global _installed
    _installed = stats


def on_tenants_flushed(listener: Callable[[frozenset[str]], None]) -> None:
    """Tell `listener` the tenants of every flush of the process's statistics (the default
    ones; a test's own pass `on_flush` themselves)."""
    _flush_listeners.append(listener)


def tenants_flushed(tenants: frozenset[str]) -> None:
    """What the statistics call after a flush: each listener hears of `tenants`."""
    for listener in list(_flush_listeners):
        listener(tenants)


def tier_of(tenant: str) -> str | None:
    """The tier a team key resolves to in the policy this process decides with (no query:
    the statistics ask from their flushing thread)."""
    policy = policy_cache().policy
    return policy.tier_of(tenant) if policy is not None else None


@lru_cache(maxsize=1)
def _default_denial_stats() -> DenialStats:
    """On the `default` Redis pool, not the limiter's: a 24 h report reads ~1,500 keys and
    may take longer than the 50 ms a decision is allowed to wait."""
    return DenialStats(
        client=statistics_client(),
        prefix=settings.LIMITER_KEY_PREFIX,
        tenant_level=TENANT_LEVEL,
        user_level=USER_LEVEL,
        usage_minutes=settings.LIMITER_USAGE_MINUTE_HOURS * 3600,
        usage_hours=settings.LIMITER_USAGE_HOUR_DAYS * 86400,
        tier_of=tier_of,
        on_expired=count_expired,
        on_flush=tenants_flushed,
    )


_UNSET = object()
_recorder: Any = _UNSET  # the process's recorder once known (None: recording is off)


def decision_recorder() -> DecisionRecorder | None:
    """The process's decision record, on the statistics' Redis when there is one; None when
    LIMITER_RECORD_LIMIT is 0 (recording off: nothing is kept, nothing costs)."""
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
    if not settings.LIMITER_RECORD_LIMIT:
        return None
    return DecisionRecorder(
        client=statistics_client(),
        limit=settings.LIMITER_RECORD_LIMIT,
        prefix=settings.LIMITER_KEY_PREFIX,
        url=settings.REDIS_URL or None,
    )
