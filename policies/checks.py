"""System checks: a policy that cannot build a limiter is reported at start-up (`manage.py
check`, `migrate`, `runserver`), not by the first request that needs it."""

from __future__ import annotations

from django.core.checks import Error, register
from django.db import DatabaseError

from core import ConfigError, MemoryStore


@register("policies")
def check_policies_compile(app_configs=None, **kwargs) -> list[Error]:
    """policies.E001: every tier, and every tenant with overrides, compiles into a limiter."""
    from .compile import read_policy

    try:
        policy = read_policy()
    except DatabaseError:
        return []  # no tables yet (before the first migrate): nothing to check
    routes = [("tier", name) for name in policy.tiers]
    routes += [("tenant", key) for key, tenant in policy.tenants.items() if tenant.overrides]
    errors = []
    for route in routes:
        try:
            policy.limiter(route, MemoryStore(1), None)
        except (ConfigError, KeyError) as error:
            errors.append(Error(f"{route[0]} {route[1]!r} cannot build a limiter: {error}",
                                hint="Fix it in the admin or with `manage.py loadpolicies`.",
                                id="policies.E001"))
    return errors
