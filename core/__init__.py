"""Limiter Admin's engine: hierarchical rate limits, pure Python, no Django.

    from core import HierarchicalLimiter, store_from_url
    limiter = HierarchicalLimiter.from_config(config, store=store_from_url("memory://"))
    decision = limiter.acquire({"user": "u1", "team": "acme", "global": "*"}, cost=1)
"""

from . import buckets, concurrency, windows  # noqa: F401  (registers the built-in rules)
from .clock import ManualClock
from .config import PriorityClass
from .errors import ConfigError, InvalidRequest, LimiterError, StoreUnavailable
from .limiter import Decision, HierarchicalLimiter
from .params import Param
from .rules import RULES, Rule, register
from .single import ClientLimiter
from .stores import MemoryStore, Store, store_from_url
from .throttle import Throttle

__all__ = [
    "RULES", "ClientLimiter", "ConfigError", "Decision", "HierarchicalLimiter", "InvalidRequest", "LimiterError",
    "ManualClock", "MemoryStore", "Param", "PriorityClass", "Rule", "Store", "StoreUnavailable",
    "Throttle", "register", "store_from_url",
]
