"""Fixtures for the engine's tests: a manual clock, a limiter builder on it, and plug-in
names that are taken out of the registry again after each test."""

import itertools
import sys

import pytest

from core import RULES, HierarchicalLimiter, ManualClock, MemoryStore

_plugin_numbers = itertools.count(1)


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def build(clock):
    """Build a limiter from a config on the test's manual clock and a fresh memory store."""

    def build(config, priorities=None, store=None):
        return HierarchicalLimiter.from_config(
            config, store=store if store is not None else MemoryStore(), clock=clock,
            priorities=priorities)

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
