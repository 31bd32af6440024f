"""The store protocol (core/stores/base.py): a store that implements only the required methods
works behind the limiter, every other operation coming from the defaults; and every store
reports its health the same way."""

import time

import pytest

from core import HierarchicalLimiter, ManualClock, MemoryStore, ReservationNotFound, StoreUnavailable, twophase
from core.reservations import OPEN
from core.stores import Store
from core.stores.redis import RedisStore
from core.twophase import Slot

from .helpers import concurrency, token_bucket

pytestmark = pytest.mark.memory_only


class DictStore(Store[list[Slot]]):
    """The smallest store: one dict, no locks, no sweeping; the required methods only."""

    clock = None

    def __init__(self):
        self.states, self.records = {}, {}

    def prepare(self, checks):
        return [
            Slot(
                c.rule,
                self.states,
                f"{c.level}:{c.key}:{c.rule.rule_id}",
                c.floor,
                c.rule.shadow,
                c.rule.counts_requests,
            )
            for c in checks
        ]

    def decide(self, plan, cost, now, lease):
        return twophase.decide(plan, cost, now, lease)

    def explain(self, plan, cost, now):
        return twophase.explain(plan, cost, now)

    def inspect(self, plan, now):
        return twophase.inspect(plan, now)

    def release(self, plan, now, lease):
        return twophase.release(plan, now, lease)

    def reset(self, plan):
        for slot in plan:
            self.states.pop(slot.name, None)

    def reserve(self, plan, cost, now, lease, record):
        finding = twophase.reserve(plan, cost, now, lease, record["expires_at"])
        if finding.blocker < 0:
            self.records[record["id"]] = {**record, "status": OPEN}
        return finding

    def reservation(self, reservation_id, now=None):
        return self.records.get(reservation_id)

    def settle(self, plan, reservation_id, actual_cost, now):
        record = self.records.pop(reservation_id, None)
        if record is None:
            raise ReservationNotFound(reservation_id)
        delta = (actual_cost or 0) - record["cost"]
        return delta, twophase.settle(plan, now, delta, record["taken_at"], (), record["lease"])


def test_a_store_with_only_the_required_methods_serves_every_call_of_the_limiter():
    clock = ManualClock()
    limiter = HierarchicalLimiter.from_config(
        {"user": [token_bucket(3, 1)], "team": [concurrency(2)]}, store=DictStore(), clock=clock
    )
    keys = {"user": "u", "team": "t"}
    first = limiter.acquire(keys)  # through the default decider
    assert first.allowed and first.lease
    decision, reservation = limiter.reserve(keys, cost=2)  # the default new_reservation_id
    assert decision.allowed and reservation is not None
    assert not limiter.acquire(keys).allowed  # two slots held
    assert limiter.settle(reservation.id, actual_cost=1).refunded == 1
    assert limiter.release(keys, first.lease) == 1
    assert limiter.inspect("user", "u")[0]["state"]["tokens"] == 1
    store = limiter.store
    assert store.health() == [{"name": "store", "state": "up", "down_since": None, "failures": 0}]
    store.ping()
    store.close()
    batch = store.decide_many([(limiter._plan(keys, None).store_plan, 1, 0.0, None)])  # the default loop
    assert batch[0].blocker == -1


def test_a_store_that_forgot_a_required_method_says_which():
    with pytest.raises(NotImplementedError, match="settle"):
        Store().settle(None, "id", None, 0.0)


def test_the_in_process_store_is_always_up():
    assert MemoryStore().health() == [
        {"name": "in-process memory, this process only", "state": "up", "down_since": None, "failures": 0}
    ]


def test_a_redis_store_reports_an_outage_from_its_first_failed_call(redis_url, unreachable_redis_url):
    assert RedisStore(url=redis_url).health() == [{"name": "Redis", "state": "up", "down_since": None, "failures": 0}]
    store = RedisStore(url=unreachable_redis_url)
    started = time.time()
    for _ in range(2):
        with pytest.raises(StoreUnavailable):
            store.ping()
    (health,) = store.health()
    assert (health["name"], health["state"], health["failures"]) == ("Redis", "down", 2)
    assert started <= health["down_since"] <= time.time()
