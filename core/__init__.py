"""Limiter Admin's engine: hierarchical rate limits, pure Python, no Django.

from core import HierarchicalLimiter, store_from_url
limiter = HierarchicalLimiter.from_config(config, store=store_from_url("memory://"))
decision = limiter.acquire({"user": "u1", "team": "acme", "global": "*"}, cost=1)
decision, reservation = limiter.reserve({"user": "u1"}, cost=4000)  # an estimate...
limiter.settle(reservation.id, actual_cost=1312)                     # ...and the real cost
"""

from . import buckets, concurrency, quotas, windows  # noqa: F401  (registers the built-in rules)
from .clock import ManualClock
from .config import PriorityClass
from .errors import ConfigError, InvalidRequest, LimiterError, ReservationNotFound, ReservationSettled, StoreUnavailable
from .limiter import Decision, HierarchicalLimiter, acquire_batch
from .params import Param
from .reservations import Reservation, Settlement
from .rules import RULES, Rule, register
from .single import ClientLimiter
from .stores import MemoryStore, Store, store_from_url
from .throttle import Throttle
from .twins import RedisTwin

__all__ = [
    "RULES",
    "ClientLimiter",
    "ConfigError",
    "Decision",
    "HierarchicalLimiter",
    "InvalidRequest",
    "LimiterError",
    "ManualClock",
    "MemoryStore",
    "Param",
    "PriorityClass",
    "RedisTwin",
    "Reservation",
    "ReservationNotFound",
    "ReservationSettled",
    "Rule",
    "Settlement",
    "Store",
    "StoreUnavailable",
    "Throttle",
    "acquire_batch",
    "register",
    "store_from_url",
]
