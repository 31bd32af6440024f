"""Worked examples, each with its numbers: one bucket or window per tenant, a gateway with a
request rate and a burst, a flood of threads, and hierarchical limits (user, team) whose
buckets are followed second by second."""

import math
import threading

from core import HierarchicalLimiter, MemoryStore, Param, Rule, register

from .helpers import allowed_in_a_row, fixed_window, sliding_window, state_of, token_bucket

# --- one level: token bucket, sliding window log, gateway, flood --------------------------


def test_a_bucket_of_two_allows_twice_blocks_then_allows_after_one_second(build, clock):
    limiter = build({"tenant": [token_bucket(2, 1)]})
    keys = {"tenant": "a"}
    assert allowed_in_a_row(limiter, keys, 2) == [True, True]
    third = limiter.acquire(keys)
    assert not third.allowed
    assert third.reason == "RATE_LIMITED"
    clock.advance(1.0)
    assert limiter.acquire(keys).allowed


def test_spending_one_tenant_does_not_spend_another():
    # The seed runs this one on the default clock: with no refill, time does not matter.
    limiter = HierarchicalLimiter.from_config({"tenant": [token_bucket(1, 0)]}, store=MemoryStore())
    assert limiter.acquire({"tenant": "x"}).allowed
    assert limiter.acquire({"tenant": "y"}).allowed
    assert not limiter.acquire({"tenant": "x"}).allowed


def test_a_window_of_two_per_ten_seconds_opens_again_after_ten_point_one_seconds(build, clock):
    limiter = build({"tenant": [sliding_window(2, 10)]})
    keys = {"tenant": "k"}
    assert allowed_in_a_row(limiter, keys, 3) == [True, True, False]
    clock.advance(10.1)
    assert limiter.acquire(keys).allowed


def gateway(rpm, burst, clock):
    """A gateway's limits: requests per minute, then a burst bucket that never refills."""
    return HierarchicalLimiter.from_config(
        {
            "tenant": [
                sliding_window(rpm, 60, label="RPM_LIMIT", counts="requests"),
                token_bucket(burst, 0, label="BURST_LIMIT"),
            ]
        },
        store=MemoryStore(),
        clock=clock,
    )


def test_the_gateway_reports_burst_limit_on_the_third_call_while_rpm_has_room(clock):
    limiter = gateway(rpm=5, burst=2, clock=clock)
    keys = {"tenant": "t"}
    assert allowed_in_a_row(limiter, keys, 2) == [True, True]
    third = limiter.acquire(keys)
    assert not third.allowed
    assert third.reason == "BURST_LIMIT"
    assert third.blocked_by == "tenant: token_bucket(2, 0/s)"
    # Unlike the seed, the denied call left no event in the RPM log: denials consume nothing.
    assert state_of(limiter, "tenant", "t", 0)["used"] == 2


def test_eighty_threads_against_a_burst_of_fifty_get_exactly_fifty_allows(clock, frequent_thread_switches):
    limiter = gateway(rpm=100, burst=50, clock=clock)
    start = threading.Barrier(80)
    results = []

    def worker():
        start.wait()
        results.append(limiter.acquire({"tenant": "tenant"}).allowed)

    threads = [threading.Thread(target=worker) for _ in range(80)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results.count(True) == 50
    assert results.count(False) == 30


# --- hierarchical limits -----------------------------------------------------------------


def user_and_team(build):
    return build({"user": [token_bucket(3, 1)], "team": [token_bucket(5, 1)]})


def test_a_user_gets_three_then_waits_one_second_for_the_next(build, clock):
    limiter = user_and_team(build)
    keys = {"user": "u1", "team": "t1"}
    assert allowed_in_a_row(limiter, keys, 4) == [True, True, True, False]
    denied = limiter.acquire(keys)
    assert denied.retry_after == 1.0
    assert denied.blocked_by.startswith("user")
    clock.advance(1.0)
    assert limiter.acquire(keys).allowed


def test_a_team_limit_is_shared_and_its_denial_takes_nothing_from_the_user(build):
    limiter = user_and_team(build)
    assert allowed_in_a_row(limiter, {"user": "a", "team": "t"}, 3) == [True] * 3
    assert allowed_in_a_row(limiter, {"user": "b", "team": "t"}, 2) == [True] * 2
    denied = limiter.acquire({"user": "b", "team": "t"})
    assert not denied.allowed
    assert denied.blocked_by.startswith("team")
    # b's own bucket still holds its third token.
    assert state_of(limiter, "user", "b")["tokens"] == 1.0
    decision, rows = limiter.explain({"user": "b"}, 1)
    assert decision.allowed
    assert rows[0]["wait"] == 0.0


def test_a_cost_larger_than_the_capacity_never_fits(build):
    limiter = user_and_team(build)
    decision = limiter.acquire({"user": "u", "team": "t"}, cost=10)
    assert not decision.allowed
    assert decision.retry_after == math.inf
    assert decision.reason == "COST_EXCEEDS_LIMIT"
    assert decision.blocked_by == "user: token_bucket(3, 1/s)"


def test_a_config_of_a_sliding_window_and_a_fixed_window_waits_for_the_oldest_entry(build, clock):
    limiter = build({"user": [sliding_window(2, 10)], "global": [fixed_window(100, 60)]})
    keys = {"user": "u", "global": "*"}
    assert limiter.acquire(keys).allowed
    clock.advance(4)
    assert limiter.acquire(keys).allowed
    clock.advance(1)
    denied = limiter.acquire(keys)
    assert not denied.allowed
    assert denied.retry_after == 5  # the entry of t=0 leaves the window at t=10
    clock.advance(5)
    assert limiter.acquire(keys).allowed


def test_a_fixed_window_lets_twice_its_limit_through_where_two_windows_meet(build, clock):
    limiter = build({"user": [fixed_window(2, 60)]})
    keys = {"user": "k"}
    clock.advance(59)
    assert allowed_in_a_row(limiter, keys, 2) == [True, True]
    denied = limiter.acquire(keys)
    assert denied.retry_after == 1
    clock.advance(1)
    assert allowed_in_a_row(limiter, keys, 3) == [True, True, False]


def test_a_plugged_in_deny_list_denies_mallory_and_leaves_the_team_token_to_alice(build, plugin_name):
    @register(plugin_name("deny_list"))
    class DenyList(Rule):
        stateful = False
        params = (Param("keys", kind="strings", help="Keys that are always denied."),)

        def wait_for_key(self, key, now, cost):
            return math.inf if key in self.keys else 0.0

    limiter = build(
        {
            "user": [{"type": DenyList.type_name, "keys": ["mallory"], "label": "DENY_LISTED"}],
            "team": [token_bucket(1, 1)],
        }
    )
    denied = limiter.acquire({"user": "mallory", "team": "t"})
    assert not denied.allowed
    assert denied.reason == "DENY_LISTED"
    # The team has one token; alice gets it only if mallory's denial did not take it.
    assert limiter.acquire({"user": "alice", "team": "t"}).allowed


# --- hierarchical limits, bucket by bucket ------------------------------------------------


def test_a_team_bucket_of_100_at_10_per_second_is_empty_after_100_and_waits_a_tenth(build):
    limiter = build({"team": [token_bucket(100, 10)]})
    keys = {"team": "acme"}
    assert all(allowed_in_a_row(limiter, keys, 100))
    request_101 = limiter.acquire(keys)
    assert not request_101.allowed
    assert request_101.retry_after == 0.1  # 1 missing token / 10 per second
    assert request_101.blocked_by == "team: token_bucket(100, 10/s)"
    assert state_of(limiter, "team", "acme")["tokens"] == 0.0


def test_the_emptied_team_bucket_holds_50_at_five_seconds(build, clock):
    limiter = build({"team": [token_bucket(100, 10)]})
    keys = {"team": "acme"}
    allowed_in_a_row(limiter, keys, 100)
    clock.advance(5)
    assert state_of(limiter, "team", "acme")["tokens"] == 50.0
    assert limiter.acquire(keys).remaining == 49.0
