"""What decisions leave behind: `record_many` (a batch's bookkeeping) adds up to exactly what
`record` called once per decision adds, in the Prometheus counters and the statistics."""

import math

from prometheus_client import REGISTRY

from core import Decision
from core.stats import DenialStats
from policies.services.recording import record, record_many
from policies.telemetry import install_denial_stats

USER = {"user": "u1", "team": "acme"}
SHADOW = "user: sliding_window(3, 60)"
DECIDED = [
    (USER, Decision(True, remaining=4.0), 2),
    (USER, Decision(True, remaining=math.inf, reason="STORE_UNAVAILABLE", degraded=True), 1),
    (USER, Decision(False, 0.5, "user: token_bucket(10, 1/s)", "RATE_LIMITED", 0.0), 1),
    ({"user": "u2", "team": "acme"}, Decision(False, 0.5, "user: token_bucket(10, 1/s)", "RATE_LIMITED", 0.0), 1),
    ({"team": "acme"}, Decision(False, math.inf, "team: token_bucket(5, 1/s)", "COST_EXCEEDS_LIMIT", 5.0), 9),
    (USER, Decision(False, 1.0, "team: token_bucket(5, 1/s)", "STORE_UNAVAILABLE", 0.0, True), 1),
    (USER, Decision(True, remaining=3.0, shadow_blocked=(SHADOW,)), 4.5),
    ({"global": "*"}, Decision(False, 0.2, None, "RATE_LIMITED", 0.0, shadow_blocked=(SHADOW,)), 1),
]


def counters() -> dict:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in REGISTRY.collect()
        if metric.name in ("limiter_decisions", "limiter_store_unavailable", "limiter_shadow_denials")
        for sample in metric.samples
        if sample.name.endswith("_total")
    }


def left_behind(bookkeeping, clock) -> tuple[dict, dict]:
    """What `bookkeeping` adds to the counters, and the statistics it leaves."""
    stats = DenialStats(clock=clock, flush_every=None)
    install_denial_stats(stats)
    try:
        before = counters()
        bookkeeping()
        after = counters()
    finally:
        install_denial_stats(None)
    added = {name: value - before.get(name, 0) for name, value in after.items() if value != before.get(name, 0)}
    return added, stats.report(300), stats.usage("acme", 300)


def test_a_batchs_bookkeeping_adds_up_to_one_record_per_decision(clock):
    one_by_one = left_behind(lambda: [record(keys, decision, cost) for keys, decision, cost in DECIDED], clock)
    at_once = left_behind(lambda: record_many((keys, decision, cost, None) for keys, decision, cost in DECIDED), clock)
    assert at_once == one_by_one
    added = one_by_one[0]
    assert added[("limiter_decisions_total", (("level", ""), ("reason", "OK"), ("result", "allowed")))] == 2
    assert (
        added[("limiter_decisions_total", (("level", "user"), ("reason", "RATE_LIMITED"), ("result", "denied")))] == 2
    )
    assert added[("limiter_store_unavailable_total", ())] == 2
    assert added[("limiter_shadow_denials_total", (("level", "user"), ("rule", "sliding_window(3, 60)")))] == 2
    assert one_by_one[1]["denied"] == 5 and one_by_one[1]["shadow_denied"] == 2
    acme = one_by_one[2]["series"][-1]
    assert (acme["decisions"], acme["denied"], acme["shadow_denied"], acme["cost"]) == (7, 4, 1, 7.5)


def test_an_empty_batch_leaves_nothing(clock):
    assert left_behind(lambda: record_many([]), clock)[0] == {}
