"""The concurrency rule: at most `limit` requests in flight per key, each holding a slot
until it is released or its lease runs out."""

import os

import pytest

from core import HierarchicalLimiter, ManualClock, MemoryStore

from .helpers import TICK, concurrency, move_to, state_of, token_bucket

KEYS = {"user": "u"}


def in_flight(limiter, key="u", level="user"):
    return state_of(limiter, level, key)["in_flight"]


def test_it_admits_up_to_the_limit_and_hands_each_request_a_lease(build):
    limiter = build({"user": [concurrency(2)]})
    first, second, third = (limiter.acquire(KEYS) for _ in range(3))
    assert first.allowed and second.allowed and not third.allowed
    assert first.lease and second.lease and first.lease != second.lease
    assert third.lease is None
    assert third.blocked_by.startswith("user: concurrency(2, lease 60s)")
    assert in_flight(limiter) == 2


def test_a_full_key_waits_for_the_earliest_lease_to_run_out(build, clock):
    limiter = build({"user": [concurrency(2, lease=30)]})
    limiter.acquire(KEYS)
    move_to(clock, 10)
    limiter.acquire(KEYS)
    move_to(clock, 12)
    assert limiter.acquire(KEYS).retry_after == 18.0  # the slot taken at t=0 comes back at t=30


def test_releasing_a_lease_gives_its_slot_back_at_once(build):
    limiter = build({"user": [concurrency(1)]})
    held = limiter.acquire(KEYS)
    assert not limiter.acquire(KEYS).allowed
    assert limiter.release(KEYS, held.lease) == 1
    assert in_flight(limiter) == 0
    assert limiter.acquire(KEYS).allowed


def test_a_lease_that_runs_out_gives_its_slot_back_exactly_then(build, clock):
    limiter = build({"user": [concurrency(1, lease=5)]})
    limiter.acquire(KEYS)
    move_to(clock, 5 - TICK)
    assert not limiter.acquire(KEYS).allowed
    move_to(clock, 5)
    assert in_flight(limiter) == 0
    assert limiter.acquire(KEYS).allowed


def test_releasing_a_lease_twice_gives_back_only_one_slot(build):
    limiter = build({"user": [concurrency(2)]})
    first = limiter.acquire(KEYS)
    limiter.acquire(KEYS)
    assert limiter.release(KEYS, first.lease) == 1
    assert limiter.release(KEYS, first.lease) == 0
    assert in_flight(limiter) == 1
    assert [limiter.acquire(KEYS).allowed for _ in range(2)] == [True, False]


def test_releasing_a_lease_that_ran_out_gives_nothing(build, clock):
    limiter = build({"user": [concurrency(1, lease=5)]})
    old = limiter.acquire(KEYS)
    move_to(clock, 6)
    new = limiter.acquire(KEYS)
    assert new.allowed
    assert limiter.release(KEYS, old.lease) == 0
    assert in_flight(limiter) == 1


def test_releasing_an_unknown_lease_gives_nothing(build):
    limiter = build({"user": [concurrency(1)]})
    limiter.acquire(KEYS)
    assert limiter.release(KEYS, "no-such-lease") == 0
    assert not limiter.acquire(KEYS).allowed


def test_releasing_a_lease_under_another_key_does_not_free_the_owners_slot(build):
    limiter = build({"user": [concurrency(1)]})
    held = limiter.acquire({"user": "a"})
    assert limiter.release({"user": "b"}, held.lease) == 0
    assert in_flight(limiter, "a") == 1


def test_a_cost_above_one_still_holds_a_single_slot(build):
    limiter = build({"user": [concurrency(3)]})
    assert limiter.acquire(KEYS, cost=2).allowed
    assert in_flight(limiter) == 1


def test_a_cost_above_the_limit_still_fits_because_a_request_is_one_slot(build):
    # Concurrency counts requests in flight, not cost: no cost is too big for it.
    limiter = build({"user": [concurrency(2)]})
    decision = limiter.acquire(KEYS, cost=50)
    assert decision.allowed
    assert decision.remaining == 1.0


def test_keys_hold_their_slots_apart(build):
    limiter = build({"user": [concurrency(1)]})
    assert limiter.acquire({"user": "a"}).allowed
    assert limiter.acquire({"user": "b"}).allowed
    assert not limiter.acquire({"user": "a"}).allowed


def test_a_denial_at_another_level_holds_no_slot(build):
    limiter = build({"user": [concurrency(2)], "team": [token_bucket(1, 0)]})
    assert limiter.acquire({"user": "u", "team": "t"}).allowed
    denied = limiter.acquire({"user": "u", "team": "t"})
    assert not denied.allowed and denied.lease is None
    assert in_flight(limiter) == 1


def test_one_lease_covers_slots_at_every_level_and_releases_them_all(build):
    limiter = build({"user": [concurrency(1)], "team": [concurrency(1)]})
    keys = {"user": "u", "team": "t"}
    held = limiter.acquire(keys)
    assert not limiter.acquire({"user": "other", "team": "t"}).allowed
    assert limiter.release(keys, held.lease) == 2
    assert limiter.acquire({"user": "other", "team": "t"}).allowed


def test_a_request_without_concurrency_rules_gets_no_lease(build):
    limiter = build({"user": [token_bucket(1, 1)]})
    decision = limiter.acquire(KEYS)
    assert decision.allowed and decision.lease is None
    assert limiter.release(KEYS, "anything") == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_worker_hands_out_lease_ids_of_its_own():
    limiter = HierarchicalLimiter.from_config({"user": [concurrency(10)]}, store=MemoryStore(), clock=ManualClock())
    limiter.acquire({"user": "before the fork"})
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (runs in the child)
        os.write(writing, limiter.acquire({"user": "child"}).lease.encode())
        os._exit(0)
    os.close(writing)
    os.waitpid(child, 0)
    with os.fdopen(reading) as pipe:
        in_child = pipe.read()
    in_parent = limiter.acquire({"user": "parent"}).lease
    assert in_child and in_parent
    assert in_child.split("-")[0] != in_parent.split("-")[0]  # a prefix of its own, not only a number


# Without slots: for callers that could never give one back ---------------------------------


def test_without_slots_a_request_takes_no_slot_and_meets_no_concurrency_limit(build):
    limiter = build({"user": [concurrency(1), token_bucket(3, 0)], "team": [concurrency(1)]})
    held = limiter.acquire({"user": "u", "team": "t"})
    assert held.allowed and held.lease
    slotless = limiter.without_slots()
    decisions = [slotless.acquire({"user": "u", "team": "t"}) for _ in range(3)]
    # Not held back by the slots in flight, and holding none; the bucket counts every one.
    assert [d.allowed for d in decisions] == [True, True, False]
    assert all(d.lease is None for d in decisions)
    assert decisions[2].blocked_by == "user: token_bucket(3, 0/s)"
    assert in_flight(limiter) == 1 and in_flight(limiter, "t", "team") == 1


def test_without_slots_shares_every_other_rules_state_with_the_limiter(build):
    limiter = build({"user": [token_bucket(4, 0), concurrency(5)]})
    assert limiter.without_slots().acquire(KEYS, cost=3).allowed
    assert limiter.acquire(KEYS).remaining == 0  # the same bucket, whichever took from it
    assert not limiter.without_slots().acquire(KEYS).allowed


def test_a_limiter_without_concurrency_rules_is_its_own_view_without_slots(build):
    limiter = build({"user": [token_bucket(4, 0)]})
    assert limiter.without_slots() is limiter
    with_slots = build({"user": [concurrency(1)]})
    assert with_slots.without_slots() is with_slots.without_slots() is not with_slots
