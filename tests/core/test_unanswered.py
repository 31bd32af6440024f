"""core/unanswered.py: a reservation that the store made although its answer was lost (a
timeout) is cancelled once the store answers again, so its estimate is not left spent."""

import itertools
import time

from core import HierarchicalLimiter, ManualClock, MemoryStore
from core.flusher import Flusher
from core.stores.breaker import CircuitBreaker
from core.stores.redis import RedisStore
from core.unanswered import LATE_ANSWER, Unanswered
from tests.polling import until

from .helpers import token_bucket

KEYS = {"team": "acme"}
_prefixes = itertools.count()


def budget(store, clock=None):
    """A team budget of 100 that never refills: what is spent stays spent."""
    return HierarchicalLimiter.from_config({"team": [token_bucket(100, 0)]}, store=store, clock=clock)


def room(limiter):
    return limiter.explain(KEYS, cost=1)[0].remaining


def waiting_on(limiter, clock):
    """An Unanswered that cancels on `limiter`, on `clock`, flushed by hand only."""
    return Unanswered(lambda rid: limiter.settle(rid, None), clock=clock, flush_every=None, flusher=Flusher())


def test_a_reservation_redis_made_after_its_answer_timed_out_is_given_back(disposable_redis):
    """Redis is frozen while the script is in its socket: the caller gets the fail mode's
    answer after the store's 50 ms and no id. Thawed, Redis runs the script (the estimate is
    taken), and the process's flushing thread cancels the reservation afterwards."""
    store = RedisStore(url=disposable_redis.url, prefix=f"unanswered{next(_prefixes)}", timeout=0.05)
    limiter = budget(store, clock=ManualClock(1000.0))
    assert limiter.reserve({"team": "warm"}, cost=1)[1] is not None  # the functions loaded
    assert room(limiter) == 100
    disposable_redis.freeze()
    try:
        decision, reservation = limiter.reserve(KEYS, cost=60, hold=60)
    finally:
        disposable_redis.thaw()
    assert decision.degraded and reservation is None
    assert until(lambda: limiter.unanswered.cancelled == 1), "the late reservation was never cancelled"
    assert room(limiter) == 100
    assert len(limiter.unanswered) == 0


def test_a_cancel_gives_the_estimate_back_once_and_a_settled_one_is_let_go():
    clock = ManualClock(0.0)
    limiter = budget(MemoryStore(), clock=clock)
    first = limiter.reserve(KEYS, cost=60)[1]
    second = limiter.reserve(KEYS, cost=30)[1]
    limiter.settle(second.id, 30)
    unanswered = waiting_on(limiter, clock)
    unanswered.add(first.id, 60)
    unanswered.add(second.id, 60)
    assert unanswered.flush() == 1
    assert room(limiter) == 70  # the 60 came back; the settled 30 stays spent
    assert len(unanswered) == 0 and unanswered.cancelled == 1


def test_one_the_store_does_not_know_is_asked_again_until_its_answer_could_no_longer_come():
    clock = ManualClock(0.0)
    limiter = budget(MemoryStore(), clock=clock)
    unanswered = waiting_on(limiter, clock)
    unanswered.add("never-made", 60)
    assert unanswered.flush() == 0 and len(unanswered) == 1
    clock.advance(LATE_ANSWER - 0.001)
    unanswered.flush()
    assert len(unanswered) == 1
    clock.advance(0.001)
    unanswered.flush()
    assert len(unanswered) == 0 and unanswered.cancelled == 0


def test_one_whose_hold_ran_out_is_dropped_untried():
    """The store answers an expired reservation with "unknown or expired" and keeps its
    estimate: nothing to ask."""
    clock = ManualClock(0.0)
    limiter = budget(MemoryStore(), clock=clock)
    asked = []
    reservation = limiter.reserve(KEYS, cost=60, hold=10)[1]
    unanswered = Unanswered(asked.append, clock=clock, flush_every=None, flusher=Flusher())
    unanswered.add(reservation.id, 10)
    clock.advance(10)
    assert unanswered.flush() == 0
    assert asked == [] and len(unanswered) == 0


def test_while_the_store_is_down_they_wait_for_the_next_flush(unreachable_redis_url):
    limiter = budget(RedisStore(url=unreachable_redis_url, timeout=0.05))
    unanswered = waiting_on(limiter, time.monotonic)
    unanswered.add("made-maybe", 60)
    assert unanswered.flush() == 0
    assert len(unanswered) == 1 and unanswered.store_failing


def test_a_store_down_for_long_keeps_at_most_so_many(monkeypatch):
    monkeypatch.setattr("core.unanswered.MOST_WAITING", 2)
    clock = ManualClock(0.0)
    unanswered = waiting_on(budget(MemoryStore(), clock=clock), clock)
    for n in range(3):
        unanswered.add(f"r{n}", 60)
    assert len(unanswered) == 2 and unanswered.lost == 1


def test_only_a_failed_store_call_leaves_one_waiting():
    clock = ManualClock(0.0)
    limiter = budget(MemoryStore(), clock=clock)
    assert limiter.reserve(KEYS, cost=60)[1] is not None
    assert limiter.reserve(KEYS, cost=60)[1] is None  # denied: nothing taken
    assert len(limiter.unanswered) == 0


def test_only_a_store_call_that_was_tried_leaves_its_reservation_waiting(unreachable_redis_url):
    """Three calls fail (the circuit breaker's threshold); the breaker then refuses the rest
    without a try, so a long outage does not fill the list with reservations never sent."""
    breaker = CircuitBreaker(clock=ManualClock(0.0))
    limiter = budget(RedisStore(url=unreachable_redis_url, timeout=0.05, breaker=breaker), clock=ManualClock(0.0))
    for _ in range(5):
        decision, reservation = limiter.reserve(KEYS, cost=10)
        assert decision.degraded and reservation is None
    assert len(limiter.unanswered) == breaker.threshold == 3
