"""The stores' contract, property-based: for any sequence of requests, time steps, releases,
dry runs, inspections, reservations and their settlements, and batches, the in-process store
and a real Redis decide exactly alike.

The engine suite runs on both stores through the `build` fixture (conftest.py); here
hypothesis looks for a sequence that no hand-written test thought of. Both limiters share
one manual clock, so the only difference between them is where the state lives. Quotas
(hard, soft with a demotion, credits with top-ups) get sequences of their own, which jump to
the ends of their periods.
"""

import itertools
import math
from dataclasses import dataclass

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core import RULES, HierarchicalLimiter, LimiterError, ManualClock, MemoryStore, acquire_batch
from core.periods import period_bounds
from core.stores.redis import RedisStore

from .helpers import (
    concurrency,
    fixed_window,
    gcra,
    quota,
    register_lifetime_quota,
    sliding_window,
    sliding_window_counter,
    token_bucket,
)

# All six rule types over three levels, with a label, a rule that counts requests, a bucket
# that never refills, a shadow rule and a priority watermark at two levels.
# Limits are small, so that short sequences run into every one of them.
CONFIG = {
    "user": [token_bucket(3, 1, label="USER_BURST"), sliding_window(3, 10, counts="requests")],
    "team": [gcra(1, 2.5), fixed_window(3, 5), concurrency(2, lease=7)],
    "global": [sliding_window_counter(6, 4), token_bucket(8, 0), token_bucket(2, 0.5, shadow=True)],
}
PRIORITIES = {"batch": {"watermark": 0.25, "levels": ["team", "global"]}}
# For reservations, an exact log that counts cost too: its refunds come off logged entries.
SETTLING_CONFIG = {**CONFIG, "global": [*CONFIG["global"], sliding_window(7, 5)]}
WINDOWS = (4.0, 5.0, 10.0)  # the windows above: their boundaries are edges worth landing on
QUOTA = "contract_lifetime_quota"
# Quotas of every kind: a soft one that demotes past its limit (to batch's watermarks at the
# team and global levels), a hard one in a zone half an hour off UTC's hours, and credits.
QUOTA_CONFIG = {
    "user": [token_bucket(3, 1, label="USER_BURST"), quota(2, "hour", mode="soft", demote_to="batch")],
    "team": [quota(4, "hour", timezone="Asia/Kolkata"), fixed_window(3, 5)],
    "global": [quota(5, "none", label="NO_CREDITS"), token_bucket(12, 0)],
}
PERIODS = (("hour", "UTC"), ("hour", "Asia/Kolkata"))  # their ends are edges worth landing on

_prefixes = itertools.count(1)


# --- the operations a sequence is made of --------------------------------------------------


@dataclass(frozen=True)
class Acquire:
    keys: dict
    cost: float
    priority: str | None


@dataclass(frozen=True)
class Explain:
    keys: dict
    cost: float
    priority: str | None


@dataclass(frozen=True)
class Inspect:
    level: str
    key: str


@dataclass(frozen=True)
class Release:
    which: int  # index into the leases held so far, modulo their number


@dataclass(frozen=True)
class Advance:
    seconds: float


@dataclass(frozen=True)
class AdvanceToRetry:
    """Wait exactly the retry_after of the last denial: the edge where it must fit."""


@dataclass(frozen=True)
class AdvanceToBoundary:
    window: float


@dataclass(frozen=True)
class Reserve:
    keys: dict
    cost: float
    priority: str | None
    hold: float | None


@dataclass(frozen=True)
class Settle:
    which: int  # index into the reservations made so far, modulo their number
    actual_cost: float | None  # None cancels


@dataclass(frozen=True)
class Batch:
    requests: tuple  # of Acquire


@dataclass(frozen=True)
class TopUp:
    amount: float  # to the global level's credits


@dataclass(frozen=True)
class AdvanceToPeriodEnd:
    period: str
    zone: str


USERS, TEAMS = ("ann", "bob"), ("red", "blue")
# At least one level: a key set that names none is refused before any store is asked.
keys_strategy = st.fixed_dictionaries(
    {}, optional={"user": st.sampled_from(USERS), "team": st.sampled_from(TEAMS), "global": st.just("*")}
).filter(bool)
costs = st.one_of(st.sampled_from([1, 2, 0.5, 0.25, 1.5, 3]), st.floats(min_value=0.01, max_value=5, allow_nan=False))
priorities = st.sampled_from([None, None, "batch"])
seconds = st.one_of(
    st.sampled_from([0.0, 1e-6, 0.25, 0.5, 1.0, 2.0, 2.5, 4.0, 5.0, 7.0, 10.0]),
    st.floats(min_value=0, max_value=12, allow_nan=False),
)
others = st.one_of(
    st.none(),
    st.builds(Explain, keys_strategy, costs, priorities),
    st.builds(Inspect, st.sampled_from(["user", "team", "global"]), st.sampled_from(USERS + TEAMS + ("*",))),
    st.builds(Release, st.integers(0, 20)),
    st.builds(Advance, seconds),
    st.builds(AdvanceToRetry),
    st.builds(AdvanceToBoundary, st.sampled_from(WINDOWS)),
)
# Each step is a request, then perhaps something else: requests are what matter most.
steps = st.tuples(st.builds(Acquire, keys_strategy, costs, priorities), others)
starts = st.sampled_from([0.0, 1000.0, 1_700_000_000.25])  # the last: Unix time, as on Redis
# Reservations, their settlements (refunds, charges into debt, cancels), and batches.
acquires = st.builds(Acquire, keys_strategy, costs, priorities)
settles = st.builds(
    Settle,
    st.integers(0, 20),
    st.one_of(st.none(), st.sampled_from([0, 1, 2.5, 6]), st.floats(min_value=0, max_value=8, allow_nan=False)),
)
# Each step: a request or a reservation, then perhaps a settlement, perhaps something else,
# perhaps a batch (separate slots, as hypothesis flattens nested one_of into equal branches).
reservation_steps = st.tuples(
    st.one_of(
        acquires, st.builds(Reserve, keys_strategy, costs, priorities, st.sampled_from([None, None, 1.0, 3.0, 10.0]))
    ),
    st.one_of(st.none(), settles),
    others,
    st.one_of(st.none(), st.none(), st.builds(Batch, st.lists(acquires, max_size=6).map(tuple))),
)


# Quotas: requests, then perhaps a top-up or a jump to the end of a period, perhaps something else.
quota_moves = st.one_of(
    st.none(),
    st.builds(TopUp, st.sampled_from([0.5, 1, 3])),
    st.builds(AdvanceToPeriodEnd, *map(st.just, PERIODS[0])),
    st.builds(AdvanceToPeriodEnd, *map(st.just, PERIODS[1])),
)
quota_steps = st.tuples(st.builds(Acquire, keys_strategy, costs, priorities), quota_moves, others)
quota_reservation_steps = st.tuples(reservation_steps, quota_moves).map(lambda pair: (*pair[0], pair[1]))
quota_starts = st.sampled_from([0.0, 1_700_000_000.25, 1_700_001_799.5])  # the last: 0.5 s before Kolkata's hour


# --- replaying a sequence on both stores ----------------------------------------------------


def close(value):
    return pytest.approx(value, rel=1e-9, abs=1e-9)


def assert_same_decision(on_memory, on_redis):
    exact = ("allowed", "blocked_by", "reason", "degraded", "shadow_blocked")
    exact += ("over_quota",)
    assert {f: getattr(on_redis, f) for f in exact} == {f: getattr(on_memory, f) for f in exact}
    assert on_redis.retry_after == close(on_memory.retry_after)
    assert on_redis.remaining == close(on_memory.remaining)
    assert (on_redis.lease is None) == (on_memory.lease is None)


def assert_same_rows(on_memory, on_redis):
    assert len(on_redis) == len(on_memory)
    for memory_row, redis_row in zip(on_memory, on_redis):
        numbers = {"wait", "remaining", "state"}
        assert {k: v for k, v in redis_row.items() if k not in numbers} == {
            k: v for k, v in memory_row.items() if k not in numbers
        }
        for field in numbers & set(memory_row):
            if isinstance(memory_row[field], dict):  # a state: its numbers close, the rest alike
                assert redis_row[field].keys() == memory_row[field].keys()
                for name, value in memory_row[field].items():
                    expected = close(value) if isinstance(value, (int, float)) else value
                    assert redis_row[field][name] == expected, (field, name)
            else:
                assert redis_row[field] == close(memory_row[field]), field


def settle_both(memory, on_redis, held, redis_held, actual_cost):
    """Settle on both stores: the same settlement, or the same refusal."""
    outcomes = []
    for limiter, reservation in ((memory, held), (on_redis, redis_held)):
        try:
            settlement = limiter.settle(reservation.id, actual_cost)
            outcomes.append(
                ("settled", settlement.status, settlement.refunded, settlement.charged, settlement.released)
            )
        except LimiterError as error:
            outcomes.append((type(error).__name__,))
    assert outcomes[1] == outcomes[0]


def replay(steps, clock, memory, on_redis):
    """Apply every operation to both limiters and compare what each one answers."""
    leases, reservations, last_wait = [], [], None
    for op in (op for step in steps for op in step if op is not None):
        if isinstance(op, Reserve):
            (decision, held), (redis_decision, redis_held) = (
                memory.reserve(op.keys, op.cost, op.priority, op.hold),
                on_redis.reserve(op.keys, op.cost, op.priority, op.hold),
            )
            assert_same_decision(decision, redis_decision)
            assert (held is None) == (redis_held is None)
            if held is not None:
                assert redis_held.to_dict() == {**held.to_dict(), "id": redis_held.id, "lease": redis_held.lease}
                reservations.append((held, redis_held))
            elif not decision.allowed:
                last_wait = decision.retry_after
        elif isinstance(op, Settle) and reservations:
            held, redis_held = reservations[op.which % len(reservations)]
            settle_both(memory, on_redis, held, redis_held, op.actual_cost)
            for level, key in held.keys.items():  # what the settlement left, rule by rule
                assert_same_rows(memory.inspect(level, key), on_redis.inspect(level, key))
        elif isinstance(op, Batch):
            items = [(op.keys, op.cost, op.priority) for op in op.requests]
            for decision, redis_decision in zip(
                acquire_batch([(memory, *item) for item in items]),
                acquire_batch([(on_redis, *item) for item in items]),
                strict=True,
            ):
                assert_same_decision(decision, redis_decision)
        elif isinstance(op, Acquire):
            pair = (memory.acquire(op.keys, op.cost, op.priority), on_redis.acquire(op.keys, op.cost, op.priority))
            assert_same_decision(*pair)
            if pair[0].lease:
                leases.append((op.keys, *pair))
            if not pair[0].allowed:
                last_wait = pair[0].retry_after
        elif isinstance(op, Explain):
            (decision, rows), (redis_decision, redis_rows) = (
                memory.explain(op.keys, op.cost, op.priority),
                on_redis.explain(op.keys, op.cost, op.priority),
            )
            assert_same_decision(decision, redis_decision)
            assert_same_rows(rows, redis_rows)
        elif isinstance(op, Inspect):
            assert_same_rows(memory.inspect(op.level, op.key), on_redis.inspect(op.level, op.key))
        elif isinstance(op, Release) and leases:
            keys, held, redis_held = leases[op.which % len(leases)]
            assert on_redis.release(keys, redis_held.lease) == memory.release(keys, held.lease)
        elif isinstance(op, Advance):
            clock.advance(op.seconds)
        elif isinstance(op, AdvanceToRetry) and last_wait is not None and math.isfinite(last_wait):
            clock.advance(last_wait)
        elif isinstance(op, AdvanceToBoundary):
            clock.now = (math.floor(clock.now / op.window) + 1) * op.window
        elif isinstance(op, TopUp):
            balance = memory.top_up("global", "*", "NO_CREDITS", op.amount)
            assert on_redis.top_up("global", "*", "NO_CREDITS", op.amount) == close(balance)
        elif isinstance(op, AdvanceToPeriodEnd):
            clock.now = period_bounds(op.period, op.zone, clock.now)[1]


@pytest.fixture(scope="module")
def redis_client(redis_server):
    """One client for every example; each example's store has a prefix of its own."""
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def lifetime_quota():
    """A stateful plug-in with no Lua twin: on Redis it takes the optimistic path."""
    yield register_lifetime_quota(QUOTA)
    RULES.pop(QUOTA, None)


def both_stores(config, clock, client):
    memory = HierarchicalLimiter.from_config(config, store=MemoryStore(), clock=clock, priorities=PRIORITIES)
    store = RedisStore(client=client, prefix=f"contract{next(_prefixes)}")
    return memory, HierarchicalLimiter.from_config(config, store=store, clock=clock, priorities=PRIORITIES)


class TestBothStoresDecideAlike:
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(start=starts, ops=st.lists(steps, min_size=5, max_size=40))
    def test_for_any_sequence_of_requests_and_time_steps(self, redis_client, start, ops):
        clock = ManualClock(start)
        replay(ops, clock, *both_stores(CONFIG, clock, redis_client))

    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(start=starts, ops=st.lists(steps, min_size=5, max_size=30))
    # Found by this test: ann's only log entry has left the window when the gcra denies,
    # and rewriting her emptied log sent RPUSH without values. Kept as an explicit example:
    # should it come back, it fails at once, without a long shrink through Redis.
    @example(
        start=0.0,
        ops=[
            (Acquire({"user": "ann", "team": "red"}, 2, None), Advance(10.0)),
            (Acquire({"team": "red"}, 2, None), None),
            (Acquire({"user": "ann", "team": "red"}, 2, None), None),
        ],
    )
    def test_when_a_plug_in_sends_a_level_down_the_optimistic_path(self, redis_client, lifetime_quota, start, ops):
        # The team's built-in rules are then read and written from Python (WATCH/MULTI)
        # rather than by their Lua twins: their state must round-trip exactly.
        config = {**CONFIG, "team": [{"type": QUOTA, "total": 30}, *CONFIG["team"]]}
        clock = ManualClock(start)
        replay(ops, clock, *both_stores(config, clock, redis_client))


class TestBothStoresSettleAlike:
    """Reservations: every refund, charge (into debt), cancel, second settle and expiry is
    the same on both stores, and so are the decisions and states that follow."""

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(start=starts, ops=st.lists(reservation_steps, min_size=5, max_size=40))
    def test_for_any_sequence_of_reservations_settlements_and_batches(self, redis_client, start, ops):
        clock = ManualClock(start)
        replay(ops, clock, *both_stores(SETTLING_CONFIG, clock, redis_client))

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(start=starts, ops=st.lists(reservation_steps, min_size=5, max_size=30))
    def test_when_a_plug_in_sends_a_level_down_the_optimistic_path(self, redis_client, lifetime_quota, start, ops):
        config = {**SETTLING_CONFIG, "team": [{"type": QUOTA, "total": 30}, *CONFIG["team"]]}
        clock = ManualClock(start)
        replay(ops, clock, *both_stores(config, clock, redis_client))


class TestBothStoresKeepQuotasAlike:
    """Quotas: hard, soft (and the demotion it makes), credits and their top-ups, and the ends
    of their periods, on both stores alike; reservations settled against them too."""

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(start=quota_starts, ops=st.lists(quota_steps, min_size=5, max_size=40))
    def test_for_any_sequence_of_requests_top_ups_and_period_ends(self, redis_client, start, ops):
        clock = ManualClock(start)
        replay(ops, clock, *both_stores(QUOTA_CONFIG, clock, redis_client))

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(start=quota_starts, ops=st.lists(quota_reservation_steps, min_size=5, max_size=30))
    def test_for_any_sequence_of_reservations_settled_against_quotas(self, redis_client, start, ops):
        clock = ManualClock(start)
        replay(ops, clock, *both_stores(QUOTA_CONFIG, clock, redis_client))
