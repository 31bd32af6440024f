"""/metrics: the decision-time histogram by endpoint, reservations by event (expired ones
counted by the statistics' sweep) and shadow rules' would-be denials."""

import pytest
from prometheus_client import REGISTRY

from core.stats import EXPIRY_GRACE, SWEEP_EVERY, DenialStats
from policies.metrics import count_expired
from policies.telemetry import install_denial_stats

KEYS = {"user": "u1", "team": "acme", "global": "*"}


def sample(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def sweeping(api, clock):
    """The API's statistics, counting expired reservations into the metric as deployed."""
    stats = DenialStats(clock=clock, flush_every=None, on_expired=count_expired)
    install_denial_stats(stats)
    return stats


def test_each_gateway_endpoint_is_timed_in_the_histogram(api, decide_client):
    before = {e: sample("limiter_decision_seconds_count", endpoint=e) for e in ("decisions", "batch", "reservations")}
    decide_client.post("/api/v1/decisions", {"keys": KEYS}, format="json")
    decide_client.post("/api/v1/decisions/batch", {"requests": [{"keys": KEYS}] * 3}, format="json")
    decide_client.post("/api/v1/reservations", {"keys": KEYS, "cost": 2}, format="json")
    after = {e: sample("limiter_decision_seconds_count", endpoint=e) for e in before}
    assert {e: after[e] - before[e] for e in before} == {"decisions": 1, "batch": 1, "reservations": 1}
    assert sample("limiter_decision_seconds_sum", endpoint="decisions") > 0


def test_reservations_are_counted_opened_committed_cancelled_and_expired(sweeping, decide_client, clock):
    events = ("opened", "committed", "cancelled", "expired")
    before = {e: sample("limiter_reservations_total", event=e) for e in events}
    ids = [
        decide_client.post("/api/v1/reservations", {"keys": KEYS, "cost": 1, "hold": 30}, format="json").json()["id"]
        for _ in range(3)
    ]
    decide_client.post(f"/api/v1/reservations/{ids[0]}/commit", {"actual_cost": 1}, format="json")
    decide_client.post(f"/api/v1/reservations/{ids[1]}/cancel", {}, format="json")
    sweeping.flush()
    clock.advance(30 + EXPIRY_GRACE + SWEEP_EVERY + 1)  # ids[2] was never settled
    sweeping.flush()
    after = {e: sample("limiter_reservations_total", event=e) for e in events}
    assert {e: after[e] - before[e] for e in events} == {"opened": 3, "committed": 1, "cancelled": 1, "expired": 1}


def test_a_shadow_rules_would_be_denials_reach_the_metrics_page(engine, load, policy_doc, decide_client, client):
    policy_doc["tiers"]["free"]["team"].append({"type": "fixed_window", "limit": 1, "window": 60, "shadow": True})
    load(policy_doc)
    before = sample("limiter_shadow_denials_total", level="team", rule="fixed_window(1/60s)")
    for _ in range(3):
        decide_client.post("/api/v1/decisions", {"keys": {"team": "nobody"}}, format="json")
    page = client.get("/metrics").content.decode()
    # The page lists this rule's line among the shadow denials of the tests before this one.
    lines = [line for line in page.splitlines() if line.startswith("limiter_shadow_denials_total{")]
    assert any('level="team"' in line and 'rule="fixed_window(1/60s)"' in line for line in lines), lines
    assert sample("limiter_shadow_denials_total", level="team", rule="fixed_window(1/60s)") - before == 2


def test_the_flushes_cpu_reaches_the_metrics_page(db, client):
    from core.flusher import FLUSHER
    from policies import telemetry
    from policies.metrics import count_flush

    assert telemetry.FLUSHER is FLUSHER and FLUSHER.on_flushed is count_flush
    before = sample("limiter_flush_cpu_seconds_total", what="denial statistics")
    FLUSHER.on_flushed("denial statistics", 0.25)
    assert sample("limiter_flush_cpu_seconds_total", what="denial statistics") - before == pytest.approx(0.25)
    assert 'limiter_flush_cpu_seconds_total{what="denial statistics"}' in client.get("/metrics").content.decode()
