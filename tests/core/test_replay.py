"""Replaying records under two policies: reservations and their settlements, routes that
change when a tenant's overrides end, and requests a policy cannot decide."""

import math

from core import HierarchicalLimiter
from core.recorder import DECISION, RESERVATION, SETTLEMENT, Record
from core.replay import REFUSED, compare, replay

TEAM = {"team": "acme"}


def bucket(capacity, per_second=0):
    return {"team": [{"type": "token_bucket", "capacity": capacity, "per_second": per_second}]}


class Tiers:
    """A policy: `config` for every team key, or `until` (time) -> config while that lasts."""

    def __init__(self, config, later=None, until=math.inf, priorities=None):
        self.config, self.later, self.until, self.priorities = config, later, until, priorities

    def route(self, team_key, now):
        return "first" if now < self.until else "later"

    def limiter(self, route, store, clock):
        config = self.config if route == "first" else self.later
        return HierarchicalLimiter.from_config(config, store=store, clock=clock, priorities=self.priorities)

    def next_expiry(self, now):
        return self.until if now < self.until else math.inf


def name(capacity, per_second=0):
    limiter = HierarchicalLimiter.from_config(bucket(capacity, per_second))
    return f"team: {limiter.levels['team'][0].display()}"


def test_reservations_replay_their_estimate_and_settlements_refund_the_difference():
    records = [
        Record(10, RESERVATION, TEAM, 8, None, True, None, "res-1", 60.0),
        Record(11, SETTLEMENT, {}, 2, ref="res-1"),  # 6 of the 8 come back
        *(Record(12, DECISION, TEAM) for _ in range(9)),
    ]
    # Now (10 tokens, no refill): the 8 fit, 6 come back, so 8 of the 9 fit after.
    # Draft (6 tokens): the 8 never fit, nothing to settle, 6 of the 9 fit.
    result = compare(records, Tiers(bucket(10)), Tiers(bucket(6)), 0, 60, 60)
    acme = result.tenants["acme"]
    assert (acme.decisions, acme.allowed_now, acme.allowed_draft) == (10, 9, 6)
    assert (acme.newly_denied, acme.newly_allowed) == (3, 0)
    assert acme.blocked_by_draft == {name(6): 4}
    assert acme.blocked_by_now == {name(10): 1}
    assert result.replayed == 11


def test_a_cancelled_reservation_gives_everything_back():
    records = [
        Record(10, RESERVATION, TEAM, 10, None, True, None, "res-1", None),
        Record(11, SETTLEMENT, {}, None, ref="res-1"),
        *(Record(12, DECISION, TEAM) for _ in range(10)),
    ]
    assert replay(records, Tiers(bucket(10)), 0) == [None] * 12


def test_a_reservation_the_service_denied_but_the_draft_allows_holds_its_cost():
    records = [Record(10, RESERVATION, TEAM, 5, None, False, name(4), None, None), Record(11, DECISION, TEAM, 5)]
    # No settlement was recorded: under a bucket of 8 the 5 stay taken, and the next 5 do not fit.
    assert replay(records, Tiers(bucket(8)), 0) == [None, name(8)]


def test_a_team_key_is_routed_afresh_when_its_overrides_end():
    records = [*(Record(10, DECISION, TEAM) for _ in range(20)), *(Record(60, DECISION, TEAM) for _ in range(20))]
    overrides_then_tier = Tiers(bucket(100), later=bucket(5), until=50)
    result = compare(records, overrides_then_tier, Tiers(bucket(100)), 0, 120, 60)
    # Until 50 the override's 100 hold all 20; after it the tier's 5 allow 5 of the next 20.
    assert (result.totals.allowed_now, result.totals.allowed_draft) == (25, 40)
    assert result.totals.newly_allowed == 15
    assert [(p.denied_now, p.denied_draft) for p in result.series] == [(0, 0), (15, 0)]


def test_a_request_the_draft_cannot_decide_counts_as_refused():
    records = [Record(10, DECISION, TEAM, 1, "batch")]
    with_batch = Tiers(bucket(10), priorities={"batch": {"watermark": 0.5}})
    result = compare(records, with_batch, Tiers(bucket(10)), 0, 60, 60)
    assert result.totals.newly_denied == 1
    assert result.totals.blocked_by_draft == {REFUSED: 1}


def test_requests_without_a_team_key_count_in_the_totals_only():
    records = [Record(10, DECISION, {"user": "u1"}), Record(10, DECISION, TEAM)]
    result = compare(records, Tiers(bucket(10)), Tiers(bucket(10)), 0, 60, 60)
    assert list(result.tenants) == ["acme"] and result.totals.decisions == 2


def test_progress_is_told_through_both_replays(monkeypatch):
    monkeypatch.setattr("core.replay.PROGRESS_EVERY", 4)
    told = []
    records = [Record(10 + i, DECISION, TEAM) for i in range(10)]
    compare(records, Tiers(bucket(100)), Tiers(bucket(100)), 0, 60, 60, progress=lambda d, t: told.append((d, t)))
    assert told == [(4, 20), (8, 20), (14, 20), (18, 20), (20, 20)]
