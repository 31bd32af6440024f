"""Fixtures for the engine's tests: a manual clock, a limiter builder on it, and plug-in
names that are taken out of the registry again after each test.

Every test that builds its limiters with `build` is a contract test: it runs once on the
in-process store and once on a real Redis (tests/conftest.py starts the server), and both
must give the same decisions. A test marked `memory_only` runs on the in-process store alone.
"""

import itertools
import sys
from functools import partial

import pytest

from core import RULES, HierarchicalLimiter, ManualClock, MemoryStore

STORE_KINDS = ("memory", "redis", "cluster")

_plugin_numbers = itertools.count(1)
_prefix_numbers = itertools.count(1)


def pytest_generate_tests(metafunc):
    if "store_kind" in metafunc.fixturenames:
        memory_only = metafunc.definition.get_closest_marker("memory_only") is not None
        metafunc.parametrize("store_kind", ["memory"] if memory_only else STORE_KINDS, indirect=True)


@pytest.fixture
def store_kind(request):
    """Which store the test runs on: "memory", "redis" or "cluster" (a Redis Cluster of
    three primaries, on one shard: the contract is the same decisions)."""
    return request.param


@pytest.fixture
def new_store(request, store_kind):
    """Make fresh, empty stores of the kind under test. On Redis each store gets a prefix
    of its own, so that two stores in one test share nothing, as two MemoryStores would."""
    if store_kind == "memory":
        yield MemoryStore
        return
    from core.stores.cluster import ClusterStore
    from core.stores.redis import RedisStore

    made = []
    if store_kind == "cluster":
        url = request.getfixturevalue("redis_cluster_url")
        # One shard: the contract is per (level, key), and with several shards a user's key
        # lives under its team's shard (tests/core/test_cluster.py tests that layout).
        kind = partial(ClusterStore, url=url, shards=1, global_mode="split")
    else:
        url = request.getfixturevalue("redis_url")
        kind = partial(RedisStore, url=url)

    def make():
        # A timeout well above the 50 ms default: on a busy CI machine a slow reply would
        # make a degraded decision, which is not what these tests judge (test_fail_modes does).
        made.append(kind(prefix=f"test{next(_prefix_numbers)}", timeout=1.0))
        return made[-1]

    yield make
    for store in made:
        store.close()


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def build(clock, new_store):
    """Build a limiter from a config on the test's manual clock and a fresh store of the
    kind under test (on Redis too, the manual clock is what the scripts use as now)."""

    def build(config, priorities=None, store=None):
        return HierarchicalLimiter.from_config(
            config, store=store if store is not None else new_store(), clock=clock, priorities=priorities
        )

    return build


@pytest.fixture
def plugin_name():
    """Hand out registry names no other test uses, and unregister them afterwards."""
    handed_out = []

    def make(base):
        name = f"{base}_under_test_{next(_plugin_numbers)}"
        assert name not in RULES
        handed_out.append(name)
        return name

    yield make
    for name in handed_out:
        RULES.pop(name, None)


@pytest.fixture
def frequent_thread_switches():
    """Switch threads far more often than usual, so that a missing lock shows up."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)
