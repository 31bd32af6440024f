"""The Prometheus metrics, and their exposition at /metrics.

`limiter_decisions_total{result,level,reason}`, `limiter_store_unavailable_total`,
`limiter_shadow_denials_total{level,rule}` (a decision that a shadow rule would have denied,
once per such rule), `limiter_decision_seconds{endpoint}` (the time a gateway's request took
in the view), and `limiter_reservations_total{event}`: opened, committed, cancelled, and
expired. The alerts (policies.services.alerts) add `limiter_quota_tenants{band}` (tenants at
or above 80, 90 and 100 percent of a quota: no label names a tenant),
`limiter_alert_firings_total{kind}`, `limiter_alert_deliveries_total{result}` and
`limiter_alert_round_seconds`. `limiter_embedded_decisions_total{face,result}` counts the
decisions a Django app's own views made through policies.embedding (face: decorator,
middleware or throttle), which also count in the others. What increments them is
policies.services.recording; a reservation left open past its expiry is noticed by the
statistics' sweep (core.stats) and counted by the one worker that removes it from the
shared set of open reservations (`count_expired`).
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

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
FLUSH_CPU = Counter(
    "limiter_flush_cpu_seconds",
    "CPU seconds the flushing thread spent writing out buffers (core/flusher.py), by what it wrote: "
    "against the workers' CPU time, the flushes' share of it.",
    ["what"],
)
OVER_QUOTA = Counter(
    "limiter_over_quota", "Decisions let go past a soft quota, by its level and rule.", ["level", "rule"]
)
EMBEDDED_DECISIONS = Counter(
    "limiter_embedded_decisions",
    "Decisions made in a Django app's own views (the decorator, the middleware, the DRF throttle), by face and "
    "result; they count in limiter_decisions_total too.",
    ["face", "result"],
)
RESERVATIONS = Counter(
    "limiter_reservations",
    "Reservations by event: opened, committed, cancelled, expired (left open past their expiry).",
    ["event"],
)
QUOTA_BANDS = (80, 90, 100)
QUOTA_TENANTS = Gauge(
    "limiter_quota_tenants",
    "Tenants whose use of a quota is at or above `band` percent of its limit in the quota's current period.",
    ["band"],
    # Every worker sets it from the database's count, the same for all: the latest is right.
    multiprocess_mode="livemostrecent",
)
ALERT_FIRINGS = Counter(
    "limiter_alert_firings", "Alerts fired, once per tenant, rule, threshold and period, by kind.", ["kind"]
)
ALERT_DELIVERIES = Counter(
    "limiter_alert_deliveries",
    "Attempts to deliver an alert by result: delivered, failed (tried again later), given_up (its last "
    "attempt failed), test (a test sent from the console or the API).",
    ["result"],
)
ALERT_ROUND_SECONDS = Histogram(
    "limiter_alert_round_seconds",
    "Seconds one alert evaluation round took in a worker (off the decisions' path).",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0),
)
# The exposition's media type, for the view that serves metrics_text().
CONTENT_TYPE = CONTENT_TYPE_LATEST


def count_flush(what: str, seconds: float) -> None:
    """core.flusher's `on_flushed`: a flush's CPU seconds, by what it wrote."""
    FLUSH_CPU.labels(what).inc(seconds)


def count_expired(reservations: int) -> None:
    """The statistics' sweep found reservations left open past their expiry."""
    RESERVATIONS.labels("expired").inc(reservations)


def metrics_text() -> bytes:
    """Every worker's counters when gunicorn runs several (PROMETHEUS_MULTIPROC_DIR set),
    else this process's."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest(REGISTRY)
