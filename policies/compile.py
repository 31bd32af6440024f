"""The one place that turns policy rows into limiters.

    cache = PolicyCache()
    cache.decide({"user": "u1", "team": "acme", "global": "*"}, cost=1, priority="batch")

A `Policy` (policies.policy) is every row read at once into plain dicts; `PolicyCache` compiles one limiter per
tier and one per tenant whose overrides apply, lazily, and keeps them until the policy
version changes. A warm decision does no database query: the version is read at most once
per `check_every` seconds, and override expiry is a comparison against the earliest
upcoming expiry time.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.db import DatabaseError, transaction

from core import Decision, HierarchicalLimiter, ReservationNotFound, Store

from .models import Level, PolicySettings, PriorityClass, Rule, Tenant
from .policy import TENANT_LEVEL, Policy, TenantPolicy
from .signals import current_version
from .stores import limiter_store

log = logging.getLogger(__name__)

# How often a worker asks the database whether the policy changed: an edit reaches every
# worker within twice this (the check, then the reload), well inside a second.
CHECK_EVERY = 0.5


class PolicyUnavailable(RuntimeError):
    """No policy could be read, and none was read before: there is nothing to decide with."""


def read_policy() -> Policy:
    """Read the whole policy. The version is read first: data newer than it only causes
    one more reload, never a missed one."""
    with transaction.atomic():
        version = current_version()
        levels = list(Level.objects.order_by("position", "name").values_list("name", "fail_mode", "fallback_fraction"))
        tiers: dict[str, dict[str, list[dict]]] = {}
        global_rules: dict[str, list[dict]] = {}
        overrides: dict[str, dict[str, list[dict]]] = {}
        for rule in Rule.objects.select_related("tier", "tenant", "level").order_by("position", "id"):
            if rule.tier is not None:
                target = tiers.setdefault(rule.tier.name, {})
            elif rule.tenant is not None:
                target = overrides.setdefault(rule.tenant.key, {})
            else:
                target = global_rules
            target.setdefault(rule.level.name, []).append(rule.spec())
        tenants = {
            key: TenantPolicy(tier, overrides.get(key, {}), until.timestamp() if until else None)
            for key, tier, until in Tenant.objects.values_list("key", "tier__name", "overrides_until")
        }
        default_tier = PolicySettings.objects.filter(pk=1).values_list("default_tier__name", flat=True).first()
        priorities = {}
        for priority in PriorityClass.objects.prefetch_related("levels"):
            spec: dict[str, Any] = {"watermark": priority.watermark}
            names = [level.name for level in priority.levels.all()]
            if names:
                spec["levels"] = names
            priorities[priority.name] = spec
    return Policy(
        version=version,
        levels=tuple(name for name, _, _ in levels),
        fail_modes={name: {"fail_mode": mode, "fallback_fraction": fraction} for name, mode, fraction in levels},
        tiers=tiers,
        global_rules=global_rules,
        tenants=tenants,
        default_tier=default_tier,
        priorities=priorities,
    )


@dataclass
class _Compiled:
    """One policy with its routes and limiters, swapped in whole so that a thread never
    pairs one policy's routes with another's limiters."""

    policy: Policy
    routes: dict[str, tuple]  # the tenants whose overrides apply -> their route
    limiters: dict[tuple, HierarchicalLimiter]
    expiry_at: float  # the earliest upcoming override expiry


class PolicyCache:
    """Compiled limiters for every tier and tenant, reloaded when the policy version moves.

    `clock` is wall time in epoch seconds (version checks, override expiry); `limiter_clock`
    is what the limiters read (by default the store's own clock). If the database cannot be
    reached, decisions go on with the last policy read.
    """

    def __init__(
        self,
        store: Store | None = None,
        clock: Callable[[], float] = time.time,
        limiter_clock: Callable[[], float] | None = None,
        check_every: float = CHECK_EVERY,
    ) -> None:
        self.store = store if store is not None else limiter_store()
        self.clock = clock
        self.limiter_clock = limiter_clock
        self.check_every = check_every
        self._compiled: _Compiled | None = None
        self._check_at = -math.inf
        self._lock = threading.Lock()

    @property
    def policy(self) -> Policy | None:
        return self._compiled.policy if self._compiled else None

    @property
    def next_expiry(self) -> float:
        """When the next override expires (math.inf: none will)."""
        return self._compiled.expiry_at if self._compiled else math.inf

    def current(self) -> Policy:
        """The policy decisions use now (reloaded first if it may have changed)."""
        now = self.clock()
        compiled = self._compiled
        if compiled is None or now >= self._check_at or now >= compiled.expiry_at:
            compiled = self._refresh(now)
        return compiled.policy

    def decide(self, keys: Mapping[str, str], cost: float = 1, priority: str | None = None) -> Decision:
        """Decide one request with the limiter of the tenant its `team` key names."""
        return self.limiter_for(keys.get(TENANT_LEVEL)).acquire(keys, cost, priority)

    def settle(self, reservation_id: str, actual_cost: float | None = None):
        """Commit (`actual_cost`) or cancel (None) a reservation, with the limiter of the
        tenant it was made for. Raises core.ReservationNotFound or ReservationSettled."""
        now = self.limiter_clock() if self.limiter_clock is not None else self.store.clock()
        record = self.store.reservation(reservation_id, now) if isinstance(reservation_id, str) else None
        if record is None:
            raise ReservationNotFound(reservation_id)
        return self.limiter_for(record["keys"].get(TENANT_LEVEL)).settle(reservation_id, actual_cost)

    def limiter_for(self, team_key: str | None) -> HierarchicalLimiter:
        """The compiled limiter that serves `team_key` now."""
        now = self.clock()
        compiled = self._compiled
        if compiled is None or now >= self._check_at or now >= compiled.expiry_at:
            compiled = self._refresh(now)
        route = compiled.routes.get(team_key) if team_key is not None else None
        if route is None:
            route = compiled.policy.route(team_key, now)
        limiter = compiled.limiters.get(route)
        if limiter is None:
            # Two threads may both build it: harmless, the state is in the shared store.
            limiter = compiled.limiters[route] = compiled.policy.limiter(route, self.store, self.limiter_clock)
        return limiter

    def limiter_for_tier(self, tier: str) -> HierarchicalLimiter:
        """The compiled limiter of the tier named `tier`, whatever the team key; a tier the
        policy does not have (deleted since) falls back to the default tier, as an unknown
        tenant does (the system checks warn of it, policies.W001)."""
        now = self.clock()
        compiled = self._compiled
        if compiled is None or now >= self._check_at or now >= compiled.expiry_at:
            compiled = self._refresh(now)
        route = ("tier", tier if tier in compiled.policy.tiers else compiled.policy.default_tier)
        limiter = compiled.limiters.get(route)
        if limiter is None:
            limiter = compiled.limiters[route] = compiled.policy.limiter(route, self.store, self.limiter_clock)
        return limiter

    def due(self) -> bool:
        """Whether the next limiter_for (or current) asks the database first: a coroutine
        makes that call in a thread (Django's ORM is not for the event loop)."""
        compiled = self._compiled
        now = self.clock()
        return compiled is None or now >= self._check_at or now >= compiled.expiry_at

    def refresh(self) -> None:
        """Check the policy version now, whatever the time of the last check."""
        self._check_at = -math.inf
        self._refresh(self.clock(), wait=True)

    def _refresh(self, now: float, wait: bool = False) -> _Compiled:
        compiled = self._compiled
        if compiled is not None and not wait and not self._lock.acquire(blocking=False):
            # Another thread is asking the database, which may hang (a lock, a partition)
            # as long as its timeout: decide with the policy at hand rather than queue every
            # thread of the worker behind that one. Expired overrides still stop on time.
            return self._compile(compiled.policy, compiled.limiters, now) if now >= compiled.expiry_at else compiled
        if compiled is None or wait:
            self._lock.acquire()  # nothing to decide with yet, or asked to check: wait
        try:
            return self._refresh_locked(now)
        finally:
            self._lock.release()

    def _refresh_locked(self, now: float) -> _Compiled:
        compiled = self._compiled
        if compiled is None or now >= self._check_at:
            self._check_at = now + self.check_every
            policy = self._read_if_changed()
            if policy is not None:
                compiled = self._compile(policy, {}, now)
        assert compiled is not None  # with no policy yet, _read_if_changed read one or raised
        if now >= compiled.expiry_at:
            compiled = self._compile(compiled.policy, compiled.limiters, now)
        self._compiled = compiled
        return compiled

    def _read_if_changed(self) -> Policy | None:
        """The policy, if it changed since the last read; None if not, or if the database
        is unreachable and an older policy can go on deciding."""
        try:
            if self.policy is not None and current_version() == self.policy.version:
                return None
            return read_policy()
        except DatabaseError as error:
            if self.policy is None:
                raise PolicyUnavailable(f"cannot read the policy: {error}") from error
            log.warning("policy check failed, deciding with policy version %s: %s", self.policy.version, error)
            return None

    @staticmethod
    def _compile(policy: Policy, limiters: dict, now: float) -> _Compiled:
        """Route the tenants whose overrides apply now to their own limiters; keep the
        limiters that still serve a route."""
        routes = {key: ("tenant", key) for key, tenant in policy.tenants.items() if tenant.overrides_apply(now)}
        kept = {route: limiter for route, limiter in limiters.items() if route[0] == "tier" or route[1] in routes}
        return _Compiled(policy, routes, kept, policy.next_expiry(now))


_installed: PolicyCache | None = None


def policy_cache() -> PolicyCache:
    """The process's policy cache, on the process's shared store."""
    return _installed if _installed is not None else _default_policy_cache()


@lru_cache(maxsize=1)
def _default_policy_cache() -> PolicyCache:
    return PolicyCache()


def install_policy_cache(cache: PolicyCache | None) -> None:
    """Make `cache` the process's policy cache (None: back to the default). Tests use it
    to decide on a store and clock of their own."""
    global _installed
    _installed = cache
