"""The hierarchical limiter: decisions, dry runs, inspection, bad requests, shadow rules and
plug-in rules, whatever the algorithm behind them."""

import math

import pytest

from core import Decision, InvalidRequest, Param, Rule, acquire_batch, register

from .helpers import (
    TICK,
    allowed_in_a_row,
    concurrency,
    fixed_window,
    gcra,
    move_to,
    sliding_window,
    sliding_window_counter,
    state_of,
    token_bucket,
)

# --- what a decision says ------------------------------------------------------------------


def test_an_allowed_request_says_ok_and_how_much_room_is_left(build):
    limiter = build({"user": [token_bucket(3, 1)], "team": [token_bucket(10, 1)]})
    decision = limiter.acquire({"user": "u", "team": "t"})
    assert isinstance(decision, Decision)
    assert decision.allowed
    assert decision.reason == "OK"
    assert decision.retry_after == 0.0
    assert decision.blocked_by is None
    assert decision.remaining == 2.0  # the tighter of 2 (user) and 9 (team)
    assert decision.degraded is False
    assert decision.shadow_blocked == ()


def test_a_denial_waits_for_the_slowest_rule_and_names_it(build, clock):
    limiter = build({"user": [token_bucket(1, 1)], "team": [token_bucket(1, 0.5)]})
    keys = {"user": "u", "team": "t"}
    limiter.acquire(keys)
    denied = limiter.acquire(keys)
    assert not denied.allowed
    assert denied.retry_after == 2.0  # the team needs 2 s, the user only 1 s
    assert denied.blocked_by == "team: token_bucket(1, 0.5/s)"
    assert denied.reason == "RATE_LIMITED"


def test_a_denial_reports_the_blocking_rules_label_as_its_reason(build):
    limiter = build(
        {"user": [token_bucket(5, 1, label="BURST_LIMIT")], "team": [token_bucket(1, 1, label="TEAM_LIMIT")]}
    )
    limiter.acquire({"user": "u", "team": "t"})
    assert limiter.acquire({"user": "u", "team": "t"}).reason == "TEAM_LIMIT"


def test_a_level_absent_from_the_keys_is_not_checked(build):
    limiter = build({"user": [token_bucket(1, 0)], "team": [token_bucket(1, 0)]})
    assert limiter.acquire({"user": "u"}).allowed
    assert limiter.acquire({"team": "t"}).allowed
    assert not limiter.acquire({"user": "u", "team": "other"}).allowed


def test_the_retry_after_of_a_denial_is_when_the_same_request_is_allowed(build, clock):
    limiter = build({"user": [token_bucket(4, 2)], "team": [sliding_window(3, 10)]})
    keys = {"user": "u", "team": "t"}
    limiter.acquire(keys, cost=3)
    clock.advance(1)
    denied = limiter.acquire(keys, cost=2)
    assert denied.retry_after == 9.0  # the team's entry of t=0 leaves at t=10
    move_to(clock, 10 - TICK)
    assert not limiter.acquire(keys, cost=2).allowed
    move_to(clock, 10)
    assert limiter.acquire(keys, cost=2).allowed


# --- dry runs, inspection, reset -----------------------------------------------------------


def test_explain_consumes_nothing_however_often_it_is_called(build):
    limiter = build({"user": [token_bucket(2, 0)], "team": [sliding_window(2, 60)]})
    keys = {"user": "u", "team": "t"}
    for _ in range(5):
        decision, _ = limiter.explain(keys, 1)
        assert decision.allowed
    assert allowed_in_a_row(limiter, keys, 3) == [True, True, False]


def test_explain_predicts_the_decision_acquire_then_makes(build, clock):
    limiter = build({"user": [token_bucket(2, 1, label="BURST")], "team": [fixed_window(5, 60)]})
    keys = {"user": "u", "team": "t"}
    limiter.acquire(keys, cost=2)
    predicted, rows = limiter.explain(keys, 1)
    actual = limiter.acquire(keys, 1)
    assert predicted == actual
    assert not actual.allowed and actual.reason == "BURST"
    assert [(row["name"], row["wait"]) for row in rows] == [
        ("user: token_bucket(2, 1/s)", 1.0),
        ("team: fixed_window(5/60s)", 0.0),
    ]


def test_explain_reports_each_rules_room_before_any_take(build):
    limiter = build({"user": [token_bucket(3, 1)], "team": [gcra(1, 5)]})
    keys = {"user": "u", "team": "t"}
    limiter.acquire(keys)
    _, rows = limiter.explain(keys, 1)
    assert [row["remaining"] for row in rows] == [2.0, 4.0]
    assert [row["level"] for row in rows] == ["user", "team"]


def test_inspect_shows_the_live_state_of_every_rule_of_a_key(build, clock):
    limiter = build({"user": [token_bucket(10, 2), sliding_window(5, 60)]})
    limiter.acquire({"user": "u"}, cost=4)
    clock.advance(1)
    rows = limiter.inspect("user", "u")
    assert [row["rule"] for row in rows] == ["token_bucket(10, 2/s)", "sliding_window(5/60s)"]
    assert rows[0]["state"]["tokens"] == 8.0
    assert rows[1]["state"]["used"] == 4.0
    assert rows[1]["state"]["entries"] == 1


def test_inspecting_a_key_never_seen_shows_it_full(build):
    limiter = build({"user": [token_bucket(10, 2)]})
    assert state_of(limiter, "user", "nobody")["tokens"] == 10.0


def test_reset_gives_a_key_a_full_bucket_again(build):
    limiter = build({"user": [token_bucket(2, 0)]})
    allowed_in_a_row(limiter, {"user": "u"}, 2)
    limiter.reset("user", "u")
    assert allowed_in_a_row(limiter, {"user": "u"}, 3) == [True, True, False]


def test_reset_leaves_other_keys_alone(build):
    limiter = build({"user": [token_bucket(2, 0)]})
    allowed_in_a_row(limiter, {"user": "a"}, 2)
    allowed_in_a_row(limiter, {"user": "b"}, 2)
    limiter.reset("user", "a")
    assert not limiter.acquire({"user": "b"}).allowed


# --- every algorithm: a denial consumes nothing at any level ------------------------------

ALGORITHMS = {
    "token_bucket": token_bucket(3, 1),
    "gcra": gcra(1, 3),
    "sliding_window": sliding_window(3, 60),
    "sliding_window_counter": sliding_window_counter(3, 60),
    "fixed_window": fixed_window(3, 60),
    "concurrency": concurrency(3),
}


@pytest.mark.parametrize("spec", ALGORITHMS.values(), ids=ALGORITHMS.keys())
def test_a_denial_at_the_second_level_takes_nothing_at_the_first(build, spec):
    limiter = build({"user": [spec], "team": [token_bucket(1, 0)]})
    assert limiter.acquire({"user": "u", "team": "t"}).allowed
    before = limiter.inspect("user", "u")
    for _ in range(3):
        denied = limiter.acquire({"user": "u", "team": "t"})
        assert not denied.allowed and denied.blocked_by.startswith("team")
        assert denied.lease is None
    assert limiter.inspect("user", "u") == before
    # Of the user's 3, one went through; the denials left the other two.
    assert allowed_in_a_row(limiter, {"user": "u", "team": "fresh"}, 1) == [True]
    assert allowed_in_a_row(limiter, {"user": "u"}, 2) == [True, False]


@pytest.mark.parametrize("spec", ALGORITHMS.values(), ids=ALGORITHMS.keys())
def test_a_denial_at_the_first_level_takes_nothing_at_the_second(build, spec):
    limiter = build({"user": [token_bucket(1, 0)], "team": [spec]})
    assert limiter.acquire({"user": "a", "team": "t"}).allowed
    before = limiter.inspect("team", "t")
    assert not limiter.acquire({"user": "a", "team": "t"}).allowed
    assert limiter.inspect("team", "t") == before
    assert allowed_in_a_row(limiter, {"team": "t"}, 3) == [True, True, False]


# --- bad requests --------------------------------------------------------------------------

BAD_COSTS = [0, -1, -0.5, math.nan, math.inf, True, False, "1", None, [1]]


@pytest.mark.parametrize("cost", BAD_COSTS, ids=repr)
def test_it_rejects_a_cost_that_is_not_a_positive_number(build, cost):
    limiter = build({"user": [token_bucket(3, 1)]})
    with pytest.raises(InvalidRequest) as raised:
        limiter.acquire({"user": "u"}, cost=cost)
    assert raised.value.field == "cost"
    assert "cost" in str(raised.value)


@pytest.mark.parametrize("cost", BAD_COSTS, ids=repr)
def test_a_dry_run_rejects_the_same_costs(build, cost):
    limiter = build({"user": [token_bucket(3, 1)]})
    with pytest.raises(InvalidRequest, match="cost"):
        limiter.explain({"user": "u"}, cost)


def test_a_rejected_cost_consumes_nothing(build):
    limiter = build({"user": [token_bucket(1, 0)]})
    with pytest.raises(InvalidRequest):
        limiter.acquire({"user": "u"}, cost=-1)
    assert limiter.acquire({"user": "u"}).allowed


def test_it_accepts_a_fractional_cost(build):
    limiter = build({"user": [token_bucket(1, 0)]})
    assert allowed_in_a_row(limiter, {"user": "u"}, 3, cost=0.5) == [True, True, False]


@pytest.mark.parametrize("key", [7, 1.5, b"u1", ["u1"], ("u1",), {"id": "u1"}, ""], ids=repr)
def test_it_rejects_a_key_that_is_not_a_non_empty_string(build, key):
    limiter = build({"user": [token_bucket(3, 1)]})
    limiter.acquire({"user": "a-good-key"})  # a limiter that has already made plans
    with pytest.raises(InvalidRequest) as raised:
        limiter.acquire({"user": key})
    assert raised.value.field == "keys.user"


@pytest.mark.parametrize("keys", [None, "u1", ["user", "u1"]], ids=repr)
def test_it_rejects_keys_that_are_not_a_mapping(build, keys):
    limiter = build({"user": [token_bucket(3, 1)]})
    with pytest.raises(InvalidRequest) as raised:
        limiter.acquire(keys)
    assert raised.value.field == "keys"


@pytest.mark.parametrize("priority", [["batch"], {"batch"}, 3], ids=repr)
def test_it_rejects_a_priority_that_is_not_a_name(build, priority):
    limiter = build({"global": [token_bucket(3, 1)]}, {"batch": {"watermark": 0.2}})
    limiter.acquire({"global": "*"}, priority="batch")
    with pytest.raises(InvalidRequest) as raised:
        limiter.acquire({"global": "*"}, priority=priority)
    assert raised.value.field == "priority"


def test_a_key_rejected_once_is_rejected_every_time(build):
    # The limiter caches plans per key set; a bad key must never reach that cache.
    limiter = build({"user": [token_bucket(3, 1)]})
    for _ in range(3):
        with pytest.raises(InvalidRequest):
            limiter.acquire({"user": 42})


# --- key sets that name no level, or a level the limiter does not have ----------------------

LEVELS = {"user": [token_bucket(1, 0)], "team": [token_bucket(1, 0)]}
# Each entry point that takes a key set, called with `keys`.
ENTRY_POINTS = {
    "acquire": lambda limiter, keys: limiter.acquire(keys),
    "explain": lambda limiter, keys: limiter.explain(keys),
    "reserve": lambda limiter, keys: limiter.reserve(keys),
    "release": lambda limiter, keys: limiter.release(keys, "a-lease"),
}


@pytest.mark.parametrize("keys", [{"usr": "u1"}, {"user": "u1", "taem": "t"}], ids=repr)
def test_a_misspelled_level_is_refused_naming_it_and_the_known_ones(build, keys):
    # A typo must not fail open: the level it names would otherwise be unlimited for ever.
    limiter = build(LEVELS)
    typo = next(level for level in keys if level not in LEVELS)
    with pytest.raises(InvalidRequest) as raised:
        limiter.acquire(keys)
    assert raised.value.field == f"keys.{typo}"
    assert f"unknown level {typo!r}" in str(raised.value) and "known: user, team" in str(raised.value)


def test_an_empty_key_set_is_refused(build):
    limiter = build(LEVELS)
    with pytest.raises(InvalidRequest) as raised:
        limiter.acquire({})
    assert raised.value.field == "keys"
    assert "at least one level" in str(raised.value) and "known: user, team" in str(raised.value)


@pytest.mark.memory_only
@pytest.mark.parametrize("call", ENTRY_POINTS.values(), ids=ENTRY_POINTS.keys())
@pytest.mark.parametrize(
    ("keys", "field"),
    [({"usr": "u1"}, "keys.usr"), ({"user": "u1", "taem": "t"}, "keys.taem"), ({}, "keys"), ({"user": None}, "keys")],
    ids=["a typo", "a typo beside a level", "no level", "no key"],
)
def test_every_entry_point_refuses_a_key_set_with_an_unknown_level_or_none(build, call, keys, field):
    limiter = build(LEVELS)
    with pytest.raises(InvalidRequest) as raised:
        call(limiter, keys)
    assert raised.value.field == field


@pytest.mark.memory_only
def test_a_key_set_with_every_level_and_one_more_is_refused_even_once_its_plan_is_cached(build):
    limiter = build(LEVELS)
    assert limiter.acquire({"user": "u", "team": "t"}).allowed  # the plan of this key set is cached
    with pytest.raises(InvalidRequest) as raised:
        limiter.acquire({"user": "u", "team": "t", "tenant": "acme"})
    assert raised.value.field == "keys.tenant"
    assert not limiter.acquire({"user": "u", "team": "t"}).allowed  # the refusal took nothing


@pytest.mark.memory_only
def test_a_batch_refuses_an_unknown_level_by_its_index_before_anything_is_taken(build):
    limiter = build(LEVELS)
    with pytest.raises(InvalidRequest) as raised:
        acquire_batch([(limiter, {"user": "u"}), (limiter, {"usr": "u"})])
    assert raised.value.field == "1.keys.usr"
    assert limiter.acquire({"user": "u"}).allowed


@pytest.mark.memory_only
@pytest.mark.parametrize("call", ["inspect", "reset"])
def test_inspecting_or_resetting_an_unknown_level_is_refused(build, call):
    limiter = build(LEVELS)
    with pytest.raises(InvalidRequest) as raised:
        getattr(limiter, call)("usr", "u")
    assert raised.value.field == "level"
    assert "unknown level 'usr'" in str(raised.value) and "known: user, team" in str(raised.value)


@pytest.mark.memory_only
def test_a_level_left_out_or_given_as_none_is_not_checked(build):
    limiter = build(LEVELS)
    assert limiter.acquire({"user": "u", "team": None}).allowed
    assert limiter.acquire({"team": "t"}).allowed
    assert len(limiter.inspect("user", "u")) == 1


# --- shadow rules --------------------------------------------------------------------------


def test_a_shadow_rule_never_denies_and_names_itself_when_it_would_have(build):
    limiter = build({"user": [token_bucket(5, 0), token_bucket(1, 0, shadow=True)]})
    first, second, third = (limiter.acquire({"user": "u"}) for _ in range(3))
    assert first.allowed and first.shadow_blocked == ()
    assert second.allowed and second.shadow_blocked == ("user: token_bucket(1, 0/s)",)
    assert third.allowed and third.shadow_blocked == ("user: token_bucket(1, 0/s)",)
    assert third.remaining == 2.0  # the enforced bucket: 5 - 3


def test_a_shadow_rule_does_not_block_or_delay_the_enforced_rules(build):
    limiter = build({"user": [token_bucket(2, 1), token_bucket(1, 0.01, shadow=True)]})
    allowed_in_a_row(limiter, {"user": "u"}, 2)
    denied = limiter.acquire({"user": "u"})
    assert not denied.allowed
    assert denied.blocked_by == "user: token_bucket(2, 1/s)"
    assert denied.retry_after == 1.0  # not the shadow rule's 100 s
    assert denied.shadow_blocked == ("user: token_bucket(1, 0.01/s)",)


def test_a_shadow_rule_smaller_than_the_cost_does_not_make_it_exceed_the_limit(build):
    limiter = build({"user": [token_bucket(10, 0), sliding_window(2, 60, shadow=True)]})
    decision = limiter.acquire({"user": "u"}, cost=5)
    assert decision.allowed
    assert decision.shadow_blocked == ("user: sliding_window(2/60s)",)


def test_a_shadow_rule_at_another_level_is_counted_but_not_enforced(build):
    limiter = build({"user": [token_bucket(10, 0)], "team": [fixed_window(1, 60, shadow=True)]})
    results = [limiter.acquire({"user": "u", "team": "t"}) for _ in range(3)]
    assert all(d.allowed for d in results)
    assert [d.shadow_blocked for d in results] == [(), ("team: fixed_window(1/60s)",), ("team: fixed_window(1/60s)",)]
    assert state_of(limiter, "team", "t")["used"] == 1.0


def test_explain_names_the_shadow_rules_that_would_deny(build):
    limiter = build({"user": [token_bucket(5, 0), token_bucket(1, 0, shadow=True)]})
    limiter.acquire({"user": "u"})
    decision, rows = limiter.explain({"user": "u"}, 1)
    assert decision.allowed
    assert decision.shadow_blocked == ("user: token_bucket(1, 0/s)",)
    assert [row["shadow"] for row in rows] == [False, True]


# --- plug-in rules -------------------------------------------------------------------------


def test_a_plugged_in_stateful_rule_is_used_by_config_without_touching_the_limiter(build, plugin_name):
    @register(plugin_name("lifetime_quota"))
    class LifetimeQuota(Rule):
        """At most `total` cost per key, ever."""

        params = (Param("total", help="Cost allowed over the key's lifetime.", minimum=1),)

        def setup(self):
            self.capacity = float(self.total)

        # State: (idle_at, remaining, spent), as the protocol in core/rules.py asks.
        def wait(self, state, now, cost, floor):
            spent = state[2] if state else 0.0
            return 0.0 if spent + cost + floor <= self.capacity else math.inf

        def take(self, state, now, cost, lease):
            spent = (state[2] if state else 0.0) + cost
            return now + 86400, self.capacity - spent, spent

    limiter = build({"user": [{"type": LifetimeQuota.type_name, "total": 3, "label": "QUOTA"}]})
    assert allowed_in_a_row(limiter, {"user": "u"}, 4) == [True, True, True, False]
    denied = limiter.acquire({"user": "u"})
    assert denied.reason == "QUOTA"
    assert denied.retry_after == math.inf
    assert denied.blocked_by == f"user: {LifetimeQuota.type_name}(3)"
    too_big = limiter.acquire({"user": "v"}, cost=4)
    assert too_big.reason == "COST_EXCEEDS_LIMIT"


def test_a_plugged_in_stateless_rule_denies_from_the_key_alone(build, plugin_name):
    @register(plugin_name("only_internal"))
    class OnlyInternal(Rule):
        stateful = False

        def wait_for_key(self, key, now, cost):
            return 0.0 if key.startswith("internal-") else math.inf

    limiter = build({"user": [{"type": OnlyInternal.type_name}]})
    assert limiter.acquire({"user": "internal-1"}).allowed
    denied = limiter.acquire({"user": "outsider"})
    assert not denied.allowed
    assert denied.retry_after == math.inf
    assert denied.blocked_by == f"user: {OnlyInternal.type_name}()"


def test_a_shadow_stateless_rule_names_itself_in_shadow_blocked(build, plugin_name):
    @register(plugin_name("deny_all"))
    class DenyAll(Rule):
        stateful = False

        def wait_for_key(self, key, now, cost):
            return math.inf

    limiter = build({"user": [{"type": DenyAll.type_name, "shadow": True}, token_bucket(5, 0)]})
    decision = limiter.acquire({"user": "u"})
    assert decision.allowed
    assert decision.shadow_blocked == (f"user: {DenyAll.type_name}()",)


def test_a_stateless_denial_still_reports_the_longest_wait(build, clock, plugin_name):
    @register(plugin_name("slow_lane"))
    class SlowLane(Rule):
        """Denies the key `slow` for 0.5 s, whatever the cost."""

        stateful = False

        def wait_for_key(self, key, now, cost):
            return 0.5 if key == "slow" else 0.0

    limiter = build({"user": [{"type": SlowLane.type_name}], "team": [token_bucket(1, 0.25)]})
    assert limiter.acquire({"user": "fast", "team": "t"}).allowed
    denied = limiter.acquire({"user": "slow", "team": "t"})
    assert not denied.allowed
    assert denied.retry_after == 4.0  # the team bucket's wait outlasts the plug-in's 0.5 s
    assert denied.blocked_by == "team: token_bucket(1, 0.25/s)"
