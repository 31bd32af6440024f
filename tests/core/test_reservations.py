"""Reservations: reserve an estimated cost, settle it later with the real one. The refund or
charge lands exactly in every rule type, a settlement happens once, and concurrency slots
come back by settling or when the lease runs out. Every test using `build` runs on the
in-process store and on a real Redis."""

import json
import math
import string
import threading

import pytest

from core import (
    HierarchicalLimiter,
    InvalidRequest,
    ManualClock,
    Param,
    Reservation,
    ReservationNotFound,
    ReservationSettled,
    Rule,
    Settlement,
    StoreUnavailable,
    register,
)
from core.reservations import DEFAULT_HOLD
from core.stores.redis import RedisStore

from .helpers import (
    TICK,
    LifetimeQuota,
    concurrency,
    fixed_window,
    gcra,
    move_to,
    register_lifetime_quota,
    sliding_window,
    sliding_window_counter,
    state_of,
    token_bucket,
)

KEYS = {"user": "u"}

# Each rule type with room for 100, and how to read how much room it has left.
HUNDRED = {
    "token_bucket": token_bucket(100, 1),
    "gcra": gcra(1, 100),
    "never_refilling_bucket": token_bucket(100, 0),
    "fixed_window": fixed_window(100, 60),
    "sliding_window": sliding_window(100, 60),
    "sliding_window_counter": sliding_window_counter(100, 60),
}


def room(limiter, level="user", key="u", index=0):
    return state_of(limiter, level, key, index)["remaining"]


# --- reserving ------------------------------------------------------------------------------


def test_a_reservation_takes_the_estimate_and_says_when_it_expires(build, clock):
    move_to(clock, 1000)
    limiter = build({"user": [token_bucket(100, 1)]})
    decision, reservation = limiter.reserve(KEYS, cost=40)
    assert decision.allowed and decision.remaining == 60
    assert isinstance(reservation, Reservation)
    assert (reservation.keys, reservation.cost, reservation.priority) == (KEYS, 40, None)
    assert (reservation.taken_at, reservation.hold) == (1000, DEFAULT_HOLD)
    assert reservation.expires_at == 1000 + DEFAULT_HOLD
    assert reservation.lease is None
    assert room(limiter) == 60


def test_a_reservation_id_is_random_and_url_safe(build):
    limiter = build({"user": [token_bucket(100, 0)]})
    ids = {limiter.reserve(KEYS)[1].id for _ in range(20)}
    assert len(ids) == 20
    # 22 random characters (128 bits); on a cluster, then `.` and the shard its record is on.
    # All of them unreserved in URLs (RFC 3986), so an id goes in a path as it is.
    assert all(len(i.split(".")[0]) == 22 for i in ids)
    assert all(set(i) <= set(string.ascii_letters + string.digits + "-_.") for i in ids)


def test_a_reservation_goes_through_json_and_back_unchanged(build):
    limiter = build({"user": [concurrency(2)], "team": [token_bucket(10, 1)]})
    _, reservation = limiter.reserve({"user": "u", "team": "t"}, cost=2.5, hold=30)
    assert Reservation.from_dict(json.loads(json.dumps(reservation.to_dict()))) == reservation


def test_the_store_keeps_the_record_so_any_limiter_on_it_can_settle(build):
    config = {"user": [token_bucket(100, 0)]}
    limiter = build(config)
    other = build(config, store=limiter.store)  # another worker, another tenant's limiter
    _, reservation = limiter.reserve(KEYS, cost=100)
    record = limiter.store.reservation(reservation.id, limiter.clock())
    assert record == {**reservation.to_dict(), "status": "open"}
    assert other.settle(reservation.id, 25).refunded == 75
    assert room(limiter) == 75


def test_a_denied_reservation_takes_nothing_and_keeps_no_record(build):
    limiter = build({"user": [token_bucket(10, 0)]})
    limiter.acquire(KEYS, cost=8)
    decision, reservation = limiter.reserve(KEYS, cost=5)
    assert not decision.allowed and reservation is None
    assert room(limiter) == 2


def test_a_cost_that_can_never_fit_is_refused_without_a_reservation(build):
    limiter = build({"user": [token_bucket(10, 1)]})
    decision, reservation = limiter.reserve(KEYS, cost=11)
    assert (decision.reason, decision.retry_after, reservation) == ("COST_EXCEEDS_LIMIT", math.inf, None)


def test_a_reservation_keeps_the_priority_watermark(build):
    limiter = build({"global": [token_bucket(100, 0)]}, priorities={"batch": {"watermark": 0.2}})
    everyone = {"global": "*"}
    decision, reservation = limiter.reserve(everyone, cost=80, priority="batch")
    assert decision.allowed and reservation.priority == "batch"
    denied, nothing = limiter.reserve(everyone, cost=1, priority="batch")
    assert (denied.allowed, nothing) == (False, None)
    assert limiter.reserve(everyone, cost=20)[0].allowed  # no class: may use the reserve
    assert limiter.settle(reservation.id, 10).refunded == 70
    assert room(limiter, "global", "*") == 70


def test_an_unknown_priority_or_a_bad_cost_is_refused(build):
    limiter = build({"user": [token_bucket(10, 1)]})
    with pytest.raises(InvalidRequest) as error:
        limiter.reserve(KEYS, priority="vip")
    assert error.value.field == "priority"
    for cost in (0, -1, "1", True, math.nan):
        with pytest.raises(InvalidRequest) as error:
            limiter.reserve(KEYS, cost=cost)
        assert error.value.field == "cost"


@pytest.mark.parametrize("hold", [0, -1, 86400.5, "60", True, math.nan, math.inf])
def test_a_hold_that_is_not_a_number_of_seconds_up_to_a_day_is_refused(build, hold):
    limiter = build({"user": [token_bucket(10, 1)]})
    with pytest.raises(InvalidRequest) as error:
        limiter.reserve(KEYS, hold=hold)
    assert error.value.field == "hold"
    assert room(limiter) == 10


def test_the_hold_is_what_was_asked_and_at_most_the_shortest_lease(build, clock):
    assert build({"user": [token_bucket(10, 1)]}).reserve(KEYS, hold=86400)[1].hold == 86400
    limiter = build({"user": [concurrency(5, lease=30)], "team": [concurrency(5, lease=20)]})
    keys = {"user": "u", "team": "t"}
    assert limiter.reserve(keys)[1].hold == 20
    assert limiter.reserve(keys, hold=5)[1].hold == 5
    _, reservation = limiter.reserve(keys, hold=600)
    assert (reservation.hold, reservation.expires_at) == (20, clock() + 20)
    assert limiter.reserve({"user": "u"})[1].hold == 30


def test_a_stateless_rule_that_denies_leaves_no_reservation(build, plugin_name):
    @register(plugin_name("blocklist"))
    class Blocklist(Rule):
        stateful = False
        params = (Param("keys", kind="strings", help="Keys that may never go."),)

        def wait_for_key(self, key, now, cost):
            return math.inf if key in self.keys else 0.0

    limiter = build({"user": [{"type": Blocklist.type_name, "keys": ["bad"]}, token_bucket(5, 0)]})
    decision, reservation = limiter.reserve({"user": "bad"})
    assert not decision.allowed and reservation is None
    assert limiter.reserve({"user": "good"})[1] is not None


# --- settling: refunds ----------------------------------------------------------------------


@pytest.mark.parametrize("rule", HUNDRED.values(), ids=HUNDRED.keys())
def test_committing_less_than_reserved_gives_back_exactly_the_difference(build, clock, rule):
    move_to(clock, 10)
    limiter = build({"user": [rule]})
    _, reservation = limiter.reserve(KEYS, cost=100)
    settlement = limiter.settle(reservation.id, actual_cost=30)
    assert settlement == Settlement(reservation.id, "committed", 70.0, 0.0, 0)
    assert room(limiter) == 70
    assert limiter.acquire(KEYS, cost=70).allowed
    assert not limiter.acquire(KEYS, cost=TICK).allowed


@pytest.mark.parametrize("rule", HUNDRED.values(), ids=HUNDRED.keys())
def test_cancelling_gives_everything_back(build, clock, rule):
    move_to(clock, 10)
    limiter = build({"user": [rule]})
    limiter.acquire(KEYS, cost=15)
    _, reservation = limiter.reserve(KEYS, cost=80)
    assert limiter.settle(reservation.id) == Settlement(reservation.id, "cancelled", 80.0, 0.0, 0)
    assert room(limiter) == 85


def test_committing_nothing_gives_everything_back_and_counts_as_committed(build):
    limiter = build({"user": [token_bucket(100, 0)]})
    _, reservation = limiter.reserve(KEYS, cost=60)
    assert limiter.settle(reservation.id, 0) == Settlement(reservation.id, "committed", 60.0, 0.0, 0)
    assert room(limiter) == 100


def test_a_refund_never_fills_a_bucket_past_its_capacity(build, clock):
    limiter = build({"user": [token_bucket(100, 10)]})
    _, reservation = limiter.reserve(KEYS, cost=100)
    move_to(clock, 6)  # 60 tokens back by refill
    assert limiter.settle(reservation.id).refunded == 100
    assert state_of(limiter, "user", "u")["tokens"] == 100
    assert [limiter.acquire(KEYS, 50).allowed for _ in range(3)] == [True, True, False]


def test_a_bucket_refund_moves_its_refill_back_by_the_refund(build, clock):
    limiter = build({"user": [token_bucket(100, 10)]})
    _, reservation = limiter.reserve(KEYS, cost=100)
    move_to(clock, 2)  # 20 tokens back
    limiter.settle(reservation.id, 70)
    assert state_of(limiter, "user", "u")["tokens"] == pytest.approx(50)
    assert state_of(limiter, "user", "u")["full_in"] == pytest.approx(5)


def test_a_fixed_window_refund_only_comes_off_the_window_it_was_taken_in(build, clock):
    limiter = build({"user": [fixed_window(100, 60)]})
    move_to(clock, 50)
    _, reservation = limiter.reserve(KEYS, cost=30)
    move_to(clock, 60)  # a new window: the reservation was never counted in it
    limiter.acquire(KEYS, cost=90)
    limiter.settle(reservation.id)
    assert room(limiter) == 10


def test_a_sliding_log_refund_comes_off_the_entry_taken_while_it_is_in_the_window(build, clock):
    limiter = build({"user": [sliding_window(100, 60)]})
    move_to(clock, 5)
    _, early = limiter.reserve(KEYS, cost=40)
    move_to(clock, 10)
    _, late = limiter.reserve(KEYS, cost=40)
    move_to(clock, 20)
    limiter.settle(late.id, 10)
    assert state_of(limiter, "user", "u")["entries"] == 2
    assert room(limiter) == 50
    # The refunded entry leaves the window at 70 with 10, the first at 65 with 40.
    move_to(clock, 65)
    assert room(limiter) == 90
    with pytest.raises(ReservationNotFound):  # its hold of 60 ran out at 65
        limiter.settle(early.id)


def test_a_sliding_log_refund_of_an_entry_that_left_the_window_gives_nothing(build, clock):
    limiter = build({"user": [sliding_window(100, 10)]})
    _, reservation = limiter.reserve(KEYS, cost=40, hold=60)
    move_to(clock, 10)  # the entry has left the window
    limiter.acquire(KEYS, cost=100)
    assert limiter.settle(reservation.id).refunded == 40  # what the reservation asked...
    assert room(limiter) == 0  # ...but nothing to give back in the window


def test_a_sliding_log_refund_of_requests_at_one_instant_gives_back_only_its_own_cost(build):
    limiter = build({"user": [sliding_window(100, 60)]})
    limiter.acquire(KEYS, cost=20)
    _, reservation = limiter.reserve(KEYS, cost=30)
    limiter.acquire(KEYS, cost=25)
    limiter.settle(reservation.id)
    assert room(limiter) == 55


def test_a_counter_refund_comes_off_the_previous_window_while_it_still_weighs(build, clock):
    limiter = build({"user": [sliding_window_counter(100, 60)]})
    move_to(clock, 50)
    _, reservation = limiter.reserve(KEYS, cost=60)
    limiter.acquire(KEYS, cost=20)
    move_to(clock, 90)  # half of the previous window still counts: (60 + 20) x 0.5
    assert room(limiter) == pytest.approx(60)
    limiter.settle(reservation.id, 0)
    assert room(limiter) == pytest.approx(90)
    assert state_of(limiter, "user", "u")["previous"] == 20


def test_a_counter_refund_two_windows_late_gives_nothing(build, clock):
    limiter = build({"user": [sliding_window_counter(100, 10)]})
    _, reservation = limiter.reserve(KEYS, cost=60, hold=60)
    move_to(clock, 20)
    limiter.acquire(KEYS, cost=100)
    limiter.settle(reservation.id)
    assert room(limiter) == 0


def test_rules_that_count_requests_are_not_adjusted_by_cost(build):
    limiter = build({"user": [sliding_window(10, 60, counts="requests"), token_bucket(100, 0)]})
    _, reservation = limiter.reserve(KEYS, cost=50)
    limiter.settle(reservation.id, 5)
    assert state_of(limiter, "user", "u", 0)["used"] == 1
    assert room(limiter, index=1) == 95


def test_a_shadow_rule_that_would_have_denied_took_nothing_and_gets_nothing_back(build):
    limiter = build({"user": [token_bucket(100, 0), token_bucket(5, 0, shadow=True)]})
    limiter.acquire(KEYS, cost=3)
    decision, reservation = limiter.reserve(KEYS, cost=10)
    assert decision.allowed and decision.shadow_blocked == ("user: token_bucket(5, 0/s)",)
    limiter.settle(reservation.id)
    assert (room(limiter, index=0), room(limiter, index=1)) == (97, 2)


def test_a_shadow_rule_that_took_gets_its_refund(build):
    limiter = build({"user": [token_bucket(100, 0), token_bucket(50, 0, shadow=True)]})
    _, reservation = limiter.reserve(KEYS, cost=40)
    limiter.settle(reservation.id, 10)
    assert (room(limiter, index=0), room(limiter, index=1)) == (90, 40)


def test_every_level_gets_the_same_adjustment(build):
    limiter = build(
        {"user": [token_bucket(100, 0)], "team": [fixed_window(500, 60)], "global": [sliding_window(1000, 60)]}
    )
    keys = {"user": "u", "team": "t", "global": "*"}
    _, reservation = limiter.reserve(keys, cost=100)
    limiter.settle(reservation.id, 40)
    assert [room(limiter, level, key) for level, key in keys.items()] == [60, 460, 960]


# --- settling: charges and debt -------------------------------------------------------------


def test_a_charge_puts_a_bucket_into_debt_and_later_requests_wait_it_out(build, clock):
    limiter = build({"user": [token_bucket(100, 10)]})
    _, reservation = limiter.reserve(KEYS, cost=10)
    assert limiter.settle(reservation.id, 130) == Settlement(reservation.id, "committed", 0.0, 120.0, 0)
    denied = limiter.acquire(KEYS)
    assert denied.retry_after == pytest.approx(3.1)  # 30 below empty: 31 tokens to wait for
    move_to(clock, 3.1 - TICK)
    assert not limiter.acquire(KEYS).allowed
    move_to(clock, 3.1)
    assert limiter.acquire(KEYS).allowed


@pytest.mark.parametrize("rule", [token_bucket(100, 10), gcra(10, 100)], ids=["token_bucket", "gcra"])
def test_a_bucket_in_debt_shows_its_negative_balance_and_when_it_is_back_above_zero(build, clock, rule):
    limiter = build({"user": [rule]})
    _, reservation = limiter.reserve(KEYS, cost=10)
    limiter.settle(reservation.id, 130)
    state = state_of(limiter, "user", "u")
    assert state["tokens"] == pytest.approx(-30)  # not 0: the next wait is real
    assert state["remaining"] == 0
    assert state["debt_clears_in"] == pytest.approx(3.0)
    assert state["full_in"] == pytest.approx(13.0)
    move_to(clock, 3.0)
    state = state_of(limiter, "user", "u")
    assert (state["tokens"], state["debt_clears_in"]) == (pytest.approx(0, abs=1e-6), 0.0)


def test_a_bucket_that_never_refills_shows_its_debt_for_good(build):
    limiter = build({"user": [token_bucket(100, 0)]})
    _, reservation = limiter.reserve(KEYS, cost=10)
    limiter.settle(reservation.id, 130)
    state = state_of(limiter, "user", "u")
    assert (state["tokens"], state["debt_clears_in"], state["full_in"]) == (-30, math.inf, math.inf)


def test_a_bucket_out_of_debt_says_so(build):
    limiter = build({"user": [token_bucket(100, 10)]})
    limiter.acquire(KEYS, cost=100)
    assert state_of(limiter, "user", "u")["debt_clears_in"] == 0.0


def test_a_charge_to_gcra_pushes_its_arrival_time_back(build):
    limiter = build({"user": [gcra(10, 100)]})
    _, reservation = limiter.reserve(KEYS, cost=50)
    limiter.settle(reservation.id, 150)
    assert limiter.acquire(KEYS).retry_after == pytest.approx(5.1)


def test_a_charge_to_a_bucket_that_never_refills_spends_it_for_good(build):
    limiter = build({"user": [token_bucket(100, 0)]})
    _, reservation = limiter.reserve(KEYS, cost=10)
    limiter.settle(reservation.id, 130)
    assert limiter.acquire(KEYS).retry_after == math.inf


def test_a_charge_to_a_fixed_window_lasts_until_the_window_ends(build, clock):
    limiter = build({"user": [fixed_window(100, 60)]})
    move_to(clock, 30)
    _, reservation = limiter.reserve(KEYS, cost=10)
    limiter.settle(reservation.id, 150)
    assert limiter.acquire(KEYS).retry_after == 30
    move_to(clock, 60)
    assert limiter.acquire(KEYS, cost=100).allowed


def test_a_charge_to_a_sliding_log_is_a_new_entry_at_the_time_of_settling(build, clock):
    limiter = build({"user": [sliding_window(100, 60)]})
    _, reservation = limiter.reserve(KEYS, cost=10)
    move_to(clock, 20)
    limiter.settle(reservation.id, 120)  # 10 logged at 0, 110 at 20
    assert state_of(limiter, "user", "u")["entries"] == 2
    assert limiter.acquire(KEYS).retry_after == 60  # both entries must leave: at 80
    move_to(clock, 60)
    assert not limiter.acquire(KEYS).allowed  # 110 still in the window
    move_to(clock, 80)
    assert limiter.acquire(KEYS, cost=100).allowed


def test_a_charge_to_a_counter_goes_into_the_current_window(build, clock):
    limiter = build({"user": [sliding_window_counter(100, 60)]})
    move_to(clock, 50)
    _, reservation = limiter.reserve(KEYS, cost=10)
    move_to(clock, 70)
    limiter.settle(reservation.id, 50)
    state = state_of(limiter, "user", "u")
    assert (state["previous"], state["current"]) == (10, 40)


# --- settling once --------------------------------------------------------------------------


def test_settling_twice_is_refused_and_refunds_only_once(build):
    limiter = build({"user": [token_bucket(100, 0)]})
    _, reservation = limiter.reserve(KEYS, cost=100)
    limiter.settle(reservation.id, 30)
    for actual in (None, 0, 30):
        with pytest.raises(ReservationSettled, match="committed"):
            limiter.settle(reservation.id, actual)
    assert room(limiter) == 70


def test_cancelling_then_committing_is_refused(build):
    limiter = build({"user": [token_bucket(100, 0)]})
    _, reservation = limiter.reserve(KEYS, cost=100)
    limiter.settle(reservation.id)
    with pytest.raises(ReservationSettled, match="cancelled"):
        limiter.settle(reservation.id, 200)
    assert room(limiter) == 100


def test_a_settled_reservation_stays_as_a_tombstone_until_it_expires(build, clock):
    limiter = build({"user": [token_bucket(100, 0)]})
    _, reservation = limiter.reserve(KEYS, cost=10, hold=30)
    limiter.settle(reservation.id, 4)
    record = limiter.store.reservation(reservation.id, clock())
    assert (record["status"], record["actual_cost"]) == ("committed", 4)
    move_to(clock, 30 - TICK)
    with pytest.raises(ReservationSettled):
        limiter.settle(reservation.id)
    move_to(clock, 30)
    assert limiter.store.reservation(reservation.id, clock()) is None
    with pytest.raises(ReservationNotFound):
        limiter.settle(reservation.id)


def test_threads_settling_one_reservation_at_once_settle_it_once(build):
    limiter = build({"user": [token_bucket(1000, 0)]})
    _, reservation = limiter.reserve(KEYS, cost=100)
    outcomes, ready = [], threading.Barrier(8)

    def settle():
        ready.wait()
        try:
            outcomes.append(limiter.settle(reservation.id, 50))
        except ReservationSettled as error:
            outcomes.append(error)

    threads = [threading.Thread(target=settle) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(isinstance(o, Settlement) for o in outcomes) == 1
    assert sum(isinstance(o, ReservationSettled) for o in outcomes) == 7
    assert room(limiter) == 950


def test_an_unknown_id_is_not_found(build):
    limiter = build({"user": [token_bucket(100, 0)]})
    for unknown in ("no-such-reservation", "", "a b {c}"):
        with pytest.raises(ReservationNotFound):
            limiter.settle(unknown)


def test_a_reservation_expires_exactly_after_its_hold_and_keeps_its_tokens(build, clock):
    limiter = build({"user": [token_bucket(100, 0)]})
    _, reservation = limiter.reserve(KEYS, cost=100, hold=10)
    move_to(clock, 10)
    with pytest.raises(ReservationNotFound):
        limiter.settle(reservation.id, 0)
    assert room(limiter) == 0


def test_a_reservation_settles_one_tick_before_it_expires(build, clock):
    limiter = build({"user": [token_bucket(100, 0)]})
    _, reservation = limiter.reserve(KEYS, cost=100, hold=10)
    move_to(clock, 10 - TICK)
    assert limiter.settle(reservation.id, 0).refunded == 100


@pytest.mark.parametrize("actual", [-1, -TICK, "5", True, math.nan, math.inf, 2e15])
def test_an_actual_cost_that_is_not_a_number_from_zero_is_refused(build, actual):
    limiter = build({"user": [token_bucket(100, 0)]})
    _, reservation = limiter.reserve(KEYS, cost=10)
    with pytest.raises(InvalidRequest) as error:
        limiter.settle(reservation.id, actual)
    assert error.value.field == "actual_cost"
    assert limiter.store.reservation(reservation.id, limiter.clock())["status"] == "open"


def test_an_id_that_is_not_a_string_is_refused(build):
    limiter = build({"user": [token_bucket(100, 0)]})
    with pytest.raises(InvalidRequest) as error:
        limiter.settle(42)
    assert error.value.field == "reservation_id"


# --- concurrency slots ----------------------------------------------------------------------


@pytest.mark.parametrize("actual", [None, 3])
def test_settling_releases_the_concurrency_slot(build, actual):
    limiter = build({"user": [concurrency(1), token_bucket(100, 0)]})
    decision, reservation = limiter.reserve(KEYS, cost=5)
    assert decision.lease == reservation.lease is not None
    assert not limiter.acquire(KEYS).allowed
    assert limiter.settle(reservation.id, actual).released == 1
    assert state_of(limiter, "user", "u")["in_flight"] == 0
    assert limiter.acquire(KEYS).allowed


def test_one_lease_releases_a_slot_at_every_level(build):
    limiter = build({"user": [concurrency(1)], "team": [concurrency(1)]})
    keys = {"user": "u", "team": "t"}
    _, reservation = limiter.reserve(keys)
    assert limiter.settle(reservation.id, 1).released == 2


def test_a_reservation_never_settled_gets_its_slot_back_when_the_lease_runs_out(build, clock):
    limiter = build({"user": [concurrency(1, lease=5), token_bucket(100, 0)]})
    _, reservation = limiter.reserve(KEYS, cost=30)
    assert reservation.hold == 5
    move_to(clock, 5 - TICK)
    assert not limiter.acquire(KEYS).allowed
    move_to(clock, 5)
    assert limiter.acquire(KEYS).allowed
    with pytest.raises(ReservationNotFound):
        limiter.settle(reservation.id)
    assert room(limiter, index=1) == 69  # its tokens stay spent


def test_a_reservation_held_for_less_than_the_lease_holds_its_slot_no_longer(build, clock):
    # Once the reservation expires no one can settle it: its slot must not stay taken.
    limiter = build({"user": [concurrency(2, lease=30)]})
    _, reservation = limiter.reserve(KEYS, hold=10)
    held = limiter.acquire(KEYS)  # a plain request keeps the full lease
    assert state_of(limiter, "user", "u")["full_in"] == 30
    assert not limiter.acquire(KEYS).allowed
    move_to(clock, 10 - TICK)
    assert not limiter.acquire(KEYS).allowed
    move_to(clock, 10)
    assert state_of(limiter, "user", "u")["in_flight"] == 1
    assert limiter.acquire(KEYS).allowed
    assert limiter.release(KEYS, held.lease) == 1


# --- plug-in rules --------------------------------------------------------------------------


def test_a_plug_in_without_adjust_keeps_what_a_reservation_took(build, plugin_name):
    name = plugin_name("quota")
    register_lifetime_quota(name)
    limiter = build({"user": [{"type": name, "total": 100}, token_bucket(100, 0)]})
    _, reservation = limiter.reserve(KEYS, cost=40)
    assert limiter.settle(reservation.id, 10).refunded == 30
    assert (room(limiter, index=0), room(limiter, index=1)) == (60, 90)
    with pytest.raises(ReservationSettled):
        limiter.settle(reservation.id)


def test_a_plug_in_with_adjust_gets_its_refund_and_charge(build, plugin_name):
    @register(plugin_name("adjustable_quota"))
    class AdjustableQuota(LifetimeQuota):
        def adjust(self, state, now, delta, taken_at):
            spent = max(0.0, (state[2] if state else 0.0) + delta)
            return now + 86400, self.capacity - spent, spent

    limiter = build({"user": [{"type": AdjustableQuota.type_name, "total": 100}, concurrency(1)]})
    _, first = limiter.reserve(KEYS, cost=40)
    assert limiter.settle(first.id, 10) == Settlement(first.id, "committed", 30.0, 0.0, 1)
    _, second = limiter.reserve(KEYS, cost=10)
    limiter.settle(second.id, 95)
    assert room(limiter) == -5  # in debt: nothing fits until ... never, for a lifetime quota
    assert not limiter.acquire(KEYS).allowed


# --- Redis: records, TTLs, the server's clock, outages --------------------------------------


def redis_limiter(url, config, clock=None, **options):
    store = RedisStore(url=url, prefix="res", timeout=1.0)
    return HierarchicalLimiter.from_config(config, store=store, clock=clock, **options)


def test_the_record_on_redis_expires_with_its_hold_and_keeps_its_ttl_once_settled(redis_url, redis_server):
    limiter = redis_limiter(redis_url, {"user": [token_bucket(100, 1)]}, ManualClock())
    _, reservation = limiter.reserve(KEYS, cost=10, hold=30)
    admin, key = redis_server.client(), limiter.store.reservation_key(reservation.id)
    assert 30_000 < admin.pttl(key) <= 31_000  # the hold, plus a second as for every key
    limiter.settle(reservation.id, 5)
    assert 29_000 < admin.pttl(key) <= 31_000
    assert admin.hget(key, "status") == b"committed"


def test_no_key_on_redis_lives_forever_after_reserving_and_settling(redis_url, redis_server):
    config = {
        "user": [token_bucket(100, 1), sliding_window(100, 60), concurrency(5)],
        "team": [fixed_window(100, 60), sliding_window_counter(100, 60), gcra(1, 100)],
    }
    limiter = redis_limiter(redis_url, config, ManualClock(100))
    keys = {"user": "u", "team": "t"}
    for actual in (None, 0, 1, 20, 50):
        _, reservation = limiter.reserve(keys, cost=10)
        limiter.settle(reservation.id, actual)
    limiter.reserve(keys, cost=10)  # one left open
    admin = redis_server.client()
    names = list(admin.scan_iter("res:*"))
    assert len([n for n in names if b":reservation:" in n]) == 6
    assert all(admin.pttl(name) > 0 for name in names), [n for n in names if admin.pttl(n) <= 0]


def test_on_the_servers_clock_a_reservation_is_taken_at_redis_time(redis_url, redis_server):
    limiter = redis_limiter(redis_url, {"user": [token_bucket(100, 0)]})
    seconds, micros = redis_server.client().time()
    _, reservation = limiter.reserve(KEYS, cost=50)
    assert abs(reservation.taken_at - (seconds + micros / 1e6)) < 5
    assert limiter.store.reservation(reservation.id)["status"] == "open"
    assert limiter.settle(reservation.id, 20).refunded == 30
    assert state_of(limiter, "user", "u")["tokens"] == 80


def test_a_reservation_and_its_settlement_are_one_script_call_each(redis_url, redis_server):
    limiter = redis_limiter(redis_url, {"user": [token_bucket(100, 1)], "team": [concurrency(3)]}, ManualClock())
    keys = {"user": "u", "team": "t"}
    limiter.acquire(keys)  # loads the library
    admin = redis_server.client()
    admin.config_resetstat()
    _, reservation = limiter.reserve(keys, cost=10)
    limiter.settle(reservation.id, 5)
    stats = admin.info("commandstats")
    assert stats["cmdstat_fcall"]["calls"] == 2
    assert stats["cmdstat_hgetall"]["calls"] == 2  # the look-up before settling, and the script's


FAIL_MODES = {"user": "open", "team": "closed"}


def test_while_redis_is_down_a_reservation_is_decided_by_the_fail_modes_and_kept_nowhere(unreachable_redis_url):
    limiter = HierarchicalLimiter.from_config(
        {"user": [token_bucket(10, 1)], "team": [token_bucket(10, 1)]},
        store=RedisStore(url=unreachable_redis_url, prefix="down"),
        fail_modes=FAIL_MODES,
    )
    decision, reservation = limiter.reserve({"user": "u"})
    assert (decision.allowed, decision.degraded, reservation) == (True, True, None)
    decision, reservation = limiter.reserve({"user": "u", "team": "t"})
    assert (decision.allowed, decision.reason, reservation) == (False, "STORE_UNAVAILABLE", None)
    with pytest.raises(StoreUnavailable):
        limiter.settle("any-id", 1)


def test_settling_after_redis_went_down_raises_store_unavailable(disposable_redis):
    clock = ManualClock()
    limiter = redis_limiter(disposable_redis.url, {"user": [concurrency(1, lease=5)]}, clock)
    _, reservation = limiter.reserve(KEYS)
    disposable_redis.kill()
    with pytest.raises(StoreUnavailable):
        limiter.settle(reservation.id)
