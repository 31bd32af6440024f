"""The in-process store: one entry per rule and key, idle entries swept, chosen by URL."""

import traceback

import pytest

from core import ConfigError, Decision, HierarchicalLimiter, ManualClock, MemoryStore, store_from_url
from core.decision import allowed
from core.stores import Store
from core.stores.memory import SWEEP_MIN_DECISIONS, compile_lean

from .helpers import concurrency, sliding_window, token_bucket

# The in-process store's own behaviour (entries, sweeps): nothing here is a contract.
pytestmark = pytest.mark.memory_only

MANY_KEYS = 200_000


# --- choosing a store by URL ---------------------------------------------------------------


def test_a_memory_url_gives_a_fresh_memory_store():
    store = store_from_url("memory://")
    assert isinstance(store, MemoryStore)
    assert len(store) == 0
    assert store_from_url("memory://") is not store


@pytest.mark.parametrize("url", ["mongodb://localhost/0", "memcached://x", "nonsense", "", None], ids=repr)
def test_an_unknown_scheme_is_a_config_error(url):
    with pytest.raises(ConfigError) as raised:
        store_from_url(url)
    assert raised.value.path == "store"
    assert "memory" in str(raised.value)  # it says which schemes are known


def test_a_store_base_class_names_the_method_a_subclass_forgot():
    with pytest.raises(NotImplementedError, match="decide"):
        Store().decide(None, 1, 0.0, None)


# --- entries -------------------------------------------------------------------------------


def test_the_store_keeps_one_entry_per_rule_and_key(build):
    store = MemoryStore()
    limiter = build({"user": [token_bucket(5, 1), sliding_window(5, 60)], "team": [token_bucket(9, 1)]}, store=store)
    limiter.acquire({"user": "a", "team": "t"})
    limiter.acquire({"user": "b", "team": "t"})
    assert len(store) == 5  # 2 users x 2 rules + 1 team


def test_a_denial_writes_no_entry(build):
    store = MemoryStore()
    limiter = build({"user": [token_bucket(5, 1)], "team": [token_bucket(1, 0)]}, store=store)
    limiter.acquire({"user": "a", "team": "t"})
    assert not limiter.acquire({"user": "b", "team": "t"}).allowed
    assert len(store) == 2


def test_two_limiters_on_one_store_share_the_state_of_the_same_rule(clock):
    store = MemoryStore()
    config = {"team": [token_bucket(2, 0)]}
    first = HierarchicalLimiter.from_config(config, store=store, clock=clock)
    second = HierarchicalLimiter.from_config(config, store=store, clock=clock)
    assert first.acquire({"team": "t"}).allowed
    assert second.acquire({"team": "t"}).allowed
    assert not first.acquire({"team": "t"}).allowed


# --- sweeping ------------------------------------------------------------------------------


def test_a_sweep_drops_only_the_entries_that_have_gone_idle(build, clock):
    store = MemoryStore()
    limiter = build({"user": [token_bucket(5, 5)]}, store=store)
    limiter.acquire({"user": "early"})  # full again at t=0.2
    clock.advance(0.1)
    limiter.acquire({"user": "late"})  # full again at t=0.3
    assert store.sweep(0.25) == 1
    assert len(store) == 1
    assert limiter.inspect("user", "late")[0]["state"]["tokens"] == 4.0


def test_a_sweep_changes_no_decision(build, clock):
    store = MemoryStore()
    limiter = build({"user": [token_bucket(2, 1)]}, store=store)
    limiter.acquire({"user": "u"}, cost=2)
    clock.advance(2)
    store.sweep(clock())
    assert len(store) == 0
    assert [limiter.acquire({"user": "u"}).allowed for _ in range(3)] == [True, True, False]


def test_a_sliding_log_entry_is_swept_once_its_window_has_passed(build, clock):
    store = MemoryStore()
    limiter = build({"user": [sliding_window(3, 10)]}, store=store)
    limiter.acquire({"user": "u"})
    assert store.sweep(9.9) == 0
    assert store.sweep(10) == 1


def test_a_concurrency_entry_is_swept_once_its_last_lease_runs_out(build, clock):
    store = MemoryStore()
    limiter = build({"user": [concurrency(3, lease=5)]}, store=store)
    limiter.acquire({"user": "u"})
    clock.advance(2)
    limiter.acquire({"user": "u"})
    assert store.sweep(5) == 0
    assert store.sweep(7) == 1


def test_a_bucket_that_never_refills_is_not_swept_while_it_matters(build, clock):
    store = MemoryStore()
    limiter = build({"user": [token_bucket(1, 0)]}, store=store)
    limiter.acquire({"user": "u"})
    clock.advance(3600)
    assert store.sweep(clock()) == 0
    assert not limiter.acquire({"user": "u"}).allowed


@pytest.mark.parametrize(
    "user_rules",
    [[token_bucket(5, 5)], [token_bucket(5, 5), concurrency(10, lease=0.1)]],
    ids=["compiled path", "general path"],
)
def test_denials_alone_sweep_the_idle_keys_away(clock, user_rules):
    store = MemoryStore()
    limiter = HierarchicalLimiter.from_config({"user": user_rules, "team": [token_bucket(1, 0)]}, store, clock)
    for i in range(2000):
        limiter.acquire({"user": f"idle-{i}"})
    assert limiter.acquire({"user": "hot", "team": "t"}).allowed  # the team's one token, for good
    clock.advance(1.0)  # every idle key is full again
    # A whole sweep takes a round of the 64 shards, each at least 256 decisions apart; 20% more.
    denials = 64 * SWEEP_MIN_DECISIONS * 6 // 5
    assert not any(limiter.acquire({"user": "hot", "team": "t"}).allowed for _ in range(denials))
    assert len(store) <= 3  # the hot user, its team, and perhaps the hot user's slot


def fill_with_many_keys():
    """One level, a bucket of 5 refilling 5/s, each of MANY_KEYS keys hit once at t=0."""
    clock, store = ManualClock(), MemoryStore()
    limiter = HierarchicalLimiter.from_config({"user": [token_bucket(5, 5)]}, store=store, clock=clock)
    for i in range(MANY_KEYS):
        limiter.acquire({"user": f"user-{i}"})
    assert len(store) == MANY_KEYS
    clock.advance(1.0)  # every bucket was full again at t=0.2
    return limiter, store, clock


@pytest.mark.slow
def test_a_full_sweep_forgets_every_key_that_has_refilled():
    _, store, clock = fill_with_many_keys()
    assert store.sweep(clock()) == MANY_KEYS
    assert len(store) == 0


@pytest.mark.slow
def test_ongoing_traffic_on_other_keys_sweeps_the_idle_ones_away():
    limiter, store, clock = fill_with_many_keys()
    # The store promises a full sweep for about every len(store) / 2 writes; allow 20% more.
    writes = len(store) // 2 * 6 // 5
    hot = [{"user": f"hot-{i}"} for i in range(4)]
    allowed = 0
    for n in range(writes):
        clock.advance(0.05)  # each hot key comes round every 0.2 s, one token later: always allowed
        allowed += limiter.acquire(hot[n % 4]).allowed
    assert allowed == writes
    assert len(store) <= len(hot)


# --- the compiled decision -------------------------------------------------------------------


class Broken(Exception):
    pass


def test_an_error_inside_the_compiled_decision_shows_its_generated_line(build):
    limiter = build({"user": [token_bucket(5, 1)], "team": [token_bucket(9, 1)]})
    limiter.acquire({"user": "a", "team": "t"})  # the plan is built and compiled
    plan = next(iter(limiter._plans[None].values()))
    assert plan.store_plan.lean is not None

    def attempt(*_):
        raise Broken

    plan.store_plan.slots[1].table.clear()
    rule = plan.store_plan.slots[1].rule
    rule.attempt = attempt  # read when the plan is compiled again
    plan.store_plan.lean = compile_lean(plan.store_plan.slots, plan.store_plan.locks, limiter.store)
    with pytest.raises(Broken) as raised:
        plan.store_plan.lean(1.0, 0.0)
    text = "".join(traceback.format_exception(raised.value))
    assert '"<core/stores/memory.py lean decide: ' in text
    assert "s1 = a1(g1(n1), now, cost, f1)" in text


def test_the_compiled_decision_builds_the_same_fields_as_the_named_constructors(build):
    limiter = build({"user": [token_bucket(2, 1)], "team": [token_bucket(9, 1)]})
    keys = {"user": "a", "team": "t"}
    first = limiter.acquire(keys)
    assert dict(zip(Decision._fields, first)) == dict(zip(Decision._fields, allowed(1.0)))
    limiter.acquire(keys)
    third = limiter.acquire(keys)
    assert not third.allowed and third.blocked_by == "user: token_bucket(2, 1/s)" and third.remaining == 0.0
