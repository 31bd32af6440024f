"""A policy as plain data: every tier's, tenant's and level's rules, and which limiter serves
a team key. No Django here, so that a process of its own (the what-if's replay,
policies/replay_child.py) can take a Policy without setting up Django; policies.compile reads
one from the rows, policies.policyfile from a document.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from core import HierarchicalLimiter, Store

# The level whose key names a tenant.
TENANT_LEVEL = "team"
# The level whose key names a user: the statistics show a user as "team / user".
USER_LEVEL = "user"
# Where global rules go when no level is named `global`: the broadest (last) one.
GLOBAL_LEVEL = "global"


@dataclass(frozen=True)
class TenantPolicy:
    tier: str
    overrides: dict[str, list[dict]]  # level -> rule specs
    until: float | None  # epoch seconds; None: the overrides never expire

    def overrides_apply(self, now: float) -> bool:
        return bool(self.overrides) and (self.until is None or now < self.until)


@dataclass(frozen=True)
class Policy:
    """Every policy row, read at once, as plain data."""

    version: int
    levels: tuple[str, ...]
    fail_modes: dict[str, dict]
    tiers: dict[str, dict[str, list[dict]]]
    global_rules: dict[str, list[dict]]
    tenants: dict[str, TenantPolicy]
    default_tier: str | None
    priorities: dict[str, dict] = field(default_factory=dict)

    def config(self, tier: str | None, overrides: Mapping[str, list[dict]] | None = None) -> dict:
        """The engine config of a tier, with a tenant's overrides replacing whole levels."""
        rules = self.tiers.get(tier, {}) if tier else {}
        overrides = overrides or {}
        return {
            level: [*overrides.get(level, rules.get(level, [])), *self.global_rules.get(level, [])]
            for level in self.levels
        }

    def tier_of(self, team_key: str) -> str | None:
        """The tier a team key resolves to: its tenant's, else the default tier."""
        tenant = self.tenants.get(team_key)
        return tenant.tier if tenant is not None else self.default_tier

    def route(self, team_key: str | None, now: float) -> tuple[str, str | None]:
        """Which limiter serves a team key: its tenant's own, or its tier's."""
        tenant = self.tenants.get(team_key) if team_key is not None else None
        if tenant is None:
            return ("tier", self.default_tier)
        if tenant.overrides_apply(now):
            return ("tenant", team_key)
        return ("tier", tenant.tier)

    def next_expiry(self, now: float) -> float:
        """The earliest time after `now` at which some tenant's overrides stop applying."""
        return min(
            (t.until for t in self.tenants.values() if t.overrides and t.until is not None and t.until > now),
            default=math.inf,
        )

    def limiter(
        self, route: tuple[str, str | None], store: Store, clock: Callable[[], float] | None
    ) -> HierarchicalLimiter:
        kind, name = route
        if kind == "tenant":
            assert name is not None, route  # a tenant's route names the tenant
            tenant = self.tenants[name]
            config = self.config(tenant.tier, tenant.overrides)
        else:
            config = self.config(name)
        return HierarchicalLimiter.from_config(
            config, store=store, clock=clock, priorities=self.priorities, fail_modes=self.fail_modes
        )


__all__ = ["GLOBAL_LEVEL", "TENANT_LEVEL", "USER_LEVEL", "Policy", "TenantPolicy"]
