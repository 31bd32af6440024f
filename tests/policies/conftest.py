"""Fixtures for the policy store's tests: a wall clock that moves only when told, an
in-memory store, policy caches ("workers") on both, and a loader that runs the commit hooks."""

import copy
import datetime as dt
import itertools

import pytest

from core import RULES, ManualClock, MemoryStore
from policies.compile import PolicyCache
from policies.policyfile import load_policy
from tests.core.helpers import register_lifetime_quota

# 2026-06-01T00:00:00Z: the tests' wall clock starts here.
START = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)

POLICY = {
    "default_tier": "free",
    "levels": [
        {"name": "user", "fail_mode": "open"},
        {"name": "team", "fail_mode": "open"},
        {"name": "global", "fail_mode": "local", "fallback_fraction": 0.25},
    ],
    "tiers": {
        "free": {
            "user": [{"type": "token_bucket", "capacity": 10, "per_second": 1}],
            "team": [{"type": "token_bucket", "capacity": 100, "per_second": 10}],
        },
        "pro": {
            "user": [
                {"type": "sliding_window", "limit": 600, "window": 60, "label": "RPM_LIMIT"},
                {"type": "token_bucket", "capacity": 50, "per_second": 10, "label": "BURST_LIMIT"},
            ],
            "team": [{"type": "token_bucket", "capacity": 1000, "per_second": 100}],
        },
    },
    "global": [{"type": "token_bucket", "capacity": 100000, "per_second": 10000}],
    "tenants": {
        "acme": {"tier": "pro"},
        "bigco": {
            "tier": "pro",
            "overrides": {"team": [{"type": "token_bucket", "capacity": 600, "per_second": 10}]},
            "overrides_until": "2026-12-31T00:00:00Z",
        },
    },
    "priorities": {
        "interactive": {"watermark": 0.0},
        "batch": {"watermark": 0.2, "levels": ["global"]},
    },
}


@pytest.fixture
def policy():
    """A fresh copy of the example policy of SPEC.md, to change at will."""
    return copy.deepcopy(POLICY)


@pytest.fixture
def clock():
    return ManualClock(START.timestamp())


@pytest.fixture
def store():
    return MemoryStore()


@pytest.fixture
def commits(django_capture_on_commit_callbacks):
    """Run the on-commit hooks of what the block does, as a real commit would."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


@pytest.fixture
def load(commits):
    """Load a policy document, committing (hooks run: the policy version moves)."""

    def load(doc):
        with commits():
            return load_policy(doc)

    return load


@pytest.fixture
def worker(store, clock):
    """Make a policy cache, as one worker process would have, on the shared store."""
    return lambda: PolicyCache(store=store, clock=clock, limiter_clock=clock)


_plugins = itertools.count()


@pytest.fixture
def plugin_rule():
    """The name of a plug-in rule type registered for this test only: a lifetime quota (one
    parameter, `total`), declared outside the engine."""
    name = f"lifetime_quota_{next(_plugins)}"
    register_lifetime_quota(name)
    yield name
    RULES.pop(name, None)
