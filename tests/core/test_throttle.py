"""The client-side throttle: it sleeps until a request may go, and a waiter for a concurrency
slot wakes as soon as this process hands one back."""

import threading

import pytest

from core import HierarchicalLimiter, InvalidRequest, ManualClock, MemoryStore, Throttle

from .helpers import concurrency, move_to, token_bucket


class RecordedSleep:
    """A sleep that advances the manual clock and remembers each wait."""

    def __init__(self, clock):
        self.clock = clock
        self.waits = []

    def __call__(self, seconds):
        self.waits.append(seconds)
        self.clock.sleep(seconds)


@pytest.fixture
def sleep(clock):
    return RecordedSleep(clock)


def throttle(rules, clock, sleep):
    return Throttle.from_rules(rules, clock=clock, sleep=sleep)


def test_five_requests_on_a_bucket_of_three_at_one_per_second_go_at_0_0_0_1_2(clock, sleep):
    bucket = throttle([token_bucket(3, 1)], clock, sleep)
    sent_at = []
    for _ in range(5):
        assert bucket.acquire(1)
        sent_at.append(clock())
    assert sent_at == [0, 0, 0, 1, 2]
    assert sleep.waits == [1.0, 1.0]


def test_it_works_with_the_manual_clocks_own_sleep():
    clock = ManualClock()
    bucket = Throttle.from_rules([token_bucket(3, 1)], clock=clock, sleep=clock.sleep)
    for _ in range(5):
        bucket.acquire()
    assert clock() == 2.0


def test_a_timeout_too_short_for_the_wait_returns_false_without_sleeping(clock, sleep):
    bucket = throttle([token_bucket(3, 1)], clock, sleep)
    for _ in range(3):
        bucket.acquire(1)
    assert bucket.acquire(1, timeout=0.5) is False
    assert clock() == 0.0
    assert sleep.waits == []


def test_a_timeout_that_covers_the_wait_sleeps_and_succeeds(clock, sleep):
    bucket = throttle([token_bucket(3, 1)], clock, sleep)
    for _ in range(3):
        bucket.acquire(1)
    assert bucket.acquire(1, timeout=1.0) is True
    assert clock() == 1.0


def test_a_timeout_of_zero_takes_only_what_is_there_now(clock, sleep):
    bucket = throttle([token_bucket(2, 1)], clock, sleep)
    assert [bucket.acquire(1, timeout=0) for _ in range(3)] == [True, True, False]
    assert sleep.waits == []


def test_a_cost_that_can_never_fit_raises_instead_of_waiting_for_ever(clock, sleep):
    bucket = throttle([token_bucket(3, 1)], clock, sleep)
    with pytest.raises(InvalidRequest) as raised:
        bucket.acquire(4)
    assert raised.value.field == "cost"
    assert sleep.waits == []


def test_a_bucket_that_never_refills_raises_once_empty_unless_given_a_timeout(clock, sleep):
    bucket = throttle([token_bucket(1, 0)], clock, sleep)
    assert bucket.acquire(1)
    with pytest.raises(InvalidRequest):
        bucket.acquire(1)
    assert bucket.acquire(1, timeout=60) is False
    assert sleep.waits == []


def test_it_waits_for_every_rule_requests_and_tokens_alike(clock, sleep):
    rules = [token_bucket(2, 1, counts="requests"), token_bucket(100, 10)]
    client = throttle(rules, clock, sleep)
    assert client.acquire(40) and client.acquire(40)
    assert clock() == 0.0
    client.acquire(10)  # the request bucket is empty: 1 s; the token bucket has room
    assert clock() == 1.0
    client.acquire(30)  # 10 tokens and 1 request short: both are back 1 s later
    assert clock() == 2.0


def test_holding_a_concurrency_slot_hands_it_back_when_the_block_ends(clock, sleep):
    slots = throttle([concurrency(1)], clock, sleep)
    with slots.hold() as got:
        assert got is True
        assert slots.acquire(timeout=0) is False
    with slots.hold(timeout=0) as got_again:
        assert got_again is True


def test_a_hold_that_times_out_yields_false_and_holds_nothing(clock, sleep):
    slots = throttle([concurrency(1, lease=10)], clock, sleep)
    assert slots.acquire()
    with slots.hold(timeout=1) as got:
        assert got is False
    move_to(clock, 10)  # the first slot's lease runs out
    with slots.hold(timeout=0) as got:
        assert got is True


def test_a_hold_hands_the_slot_back_even_when_the_block_raises(clock, sleep):
    slots = throttle([concurrency(1)], clock, sleep)
    with pytest.raises(RuntimeError):
        with slots.hold():
            raise RuntimeError("the model call failed")
    assert slots.acquire(timeout=0) is True


# --- waiting for a concurrency slot ---------------------------------------------------------
# The slots' lease is an hour and the clock is the real one: a waiter that got in did so
# because a slot was handed back, never because a lease ran out. Threads are joined with a
# bound far above what a wake-up takes; it only keeps a broken throttle from hanging the run.
AN_HOUR = 3600
JOIN = 30


class DenialSignal(HierarchicalLimiter):
    """A limiter that counts its denials: a thread it denied is about to wait."""

    def acquire(self, keys, cost=1, priority=None):
        decision = super().acquire(keys, cost, priority)
        if not decision.allowed:
            with self.counted:
                self.denials += 1
                self.counted.notify_all()
        return decision

    def wait_for_denials(self, count):
        with self.counted:
            return self.counted.wait_for(lambda: self.denials >= count, JOIN)


def slot_throttle(limit=1):
    limiter = DenialSignal.from_config({"client": [concurrency(limit, lease=AN_HOUR)]}, MemoryStore(1))
    limiter.counted, limiter.denials = threading.Condition(), 0
    return Throttle(limiter, {"client": "self"})


def in_thread(call, results):
    thread = threading.Thread(target=lambda: results.append(call()), daemon=True)
    thread.start()
    return thread


def test_a_waiter_for_a_slot_wakes_when_its_holder_hands_it_back():
    slots = slot_throttle()
    got = []
    with slots.hold() as held:
        assert held
        waiter = in_thread(lambda: slots.acquire(timeout=AN_HOUR / 2), got)
        assert slots.limiter.wait_for_denials(1)  # it found the slot taken
        assert got == []
    waiter.join(JOIN)
    assert got == [True]


def test_a_timeout_shorter_than_the_lease_still_waits_for_a_release():
    slots = slot_throttle()
    got = []
    with slots.hold():
        waiter = in_thread(lambda: slots.acquire(timeout=JOIN), got)
        assert slots.limiter.wait_for_denials(1)
    waiter.join(JOIN)
    assert got == [True]  # not False at once because the lease is longer than the timeout


def test_waiters_get_the_slot_one_at_a_time_as_each_holder_hands_it_back():
    slots = slot_throttle(limit=1)
    inside, most_inside, lock = [0], [0], threading.Lock()

    def one_request():
        with slots.hold() as held:
            with lock:
                inside[0] += 1
                most_inside[0] = max(most_inside[0], inside[0])
            with lock:
                inside[0] -= 1
            return held

    results = []
    with slots.hold():
        threads = [in_thread(one_request, results) for _ in range(8)]
        assert slots.limiter.wait_for_denials(8)  # every one of them is waiting
    for thread in threads:
        thread.join(JOIN)
    assert results == [True] * 8
    assert most_inside[0] == 1


def test_a_waiter_for_a_slot_held_elsewhere_sleeps_until_the_lease_runs_out(clock, sleep):
    store = MemoryStore(1)
    elsewhere = Throttle.from_rules([concurrency(1, lease=10)], store=store, clock=clock, sleep=sleep)
    here = Throttle.from_rules([concurrency(1, lease=10)], store=store, clock=clock, sleep=sleep)
    assert elsewhere.acquire()  # held, and never handed back here
    assert here.acquire()
    assert sleep.waits == [10.0] and clock() == 10.0
