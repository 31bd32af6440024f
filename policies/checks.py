"""System checks: a policy that cannot build a limiter is reported at start-up (`manage.py
check`, `migrate`, `runserver`), not by the first request that needs it."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, register
from django.db import DatabaseError

from core import ConfigError, MemoryStore
from core.recorder import check_limit
from core.stores.cluster import check_options, parse_cluster_url
from core.stores.redis import KEY_FORMATS

from .compile import read_policy
from .services.forward_auth import authz_keys_problems, min_cost_problems


@register("policies")
def check_policies_compile(app_configs=None, **kwargs) -> list[Error]:
    """policies.E001: every tier, and every tenant with overrides, compiles into a limiter."""
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
            errors.append(
                Error(
                    f"{route[0]} {route[1]!r} cannot build a limiter: {error}",
                    hint="Fix it in the admin or with `manage.py loadpolicies`.",
                    id="policies.E001",
                )
            )
    return errors


@register("policies")
def check_cluster_settings(app_configs=None, **kwargs) -> list[Error]:
    """policies.E002: on a Redis Cluster (REDIS_URL=redis-cluster://...), the LIMITER_CLUSTER_*
    settings make a store."""
    if not (settings.REDIS_URL or "").startswith("redis-cluster://"):
        return []
    try:
        parse_cluster_url(settings.REDIS_URL)
        check_options(
            settings.LIMITER_CLUSTER_SHARDS,
            settings.LIMITER_CLUSTER_GLOBAL_MODE,
            settings.LIMITER_CLUSTER_LEASE_FRACTION,
        )
    except ConfigError as error:
        return [
            Error(
                f"the Redis Cluster settings cannot make a store: {error}",
                hint="See REDIS_URL and LIMITER_CLUSTER_* in docs/OPERATIONS.md.",
                id="policies.E002",
            )
        ]
    return []


@register("policies")
def check_key_format(app_configs=None, **kwargs) -> list[Error]:
    """policies.E003: LIMITER_KEY_FORMAT names a key format of the Redis store."""
    if settings.LIMITER_KEY_FORMAT in KEY_FORMATS:
        return []
    return [
        Error(
            f"LIMITER_KEY_FORMAT must be one of {', '.join(KEY_FORMATS)}, not {settings.LIMITER_KEY_FORMAT!r}",
            id="policies.E003",
        )
    ]


@register("policies")
def check_record_limit(app_configs=None, **kwargs) -> list[Error]:
    """policies.E004: LIMITER_RECORD_LIMIT is a number of records, 0 (off) or more."""
    try:
        check_limit(settings.LIMITER_RECORD_LIMIT)
    except ConfigError as error:
        return [Error(f"LIMITER_RECORD_LIMIT {error.reason}", id="policies.E004")]
    return []


@register("policies")
def check_authz_keys(app_configs=None, **kwargs) -> list[Error]:
    """policies.E005: LIMITER_AUTHZ_KEYS maps level names to request header names."""
    return [
        Error(f"LIMITER_AUTHZ_KEYS {problem}", id="policies.E005")
        for problem in authz_keys_problems(settings.LIMITER_AUTHZ_KEYS)
    ]


@register("policies")
def check_authz_min_cost(app_configs=None, **kwargs) -> list[Error]:
    """policies.E006: LIMITER_AUTHZ_MIN_COST is a cost, or 0 for no floor."""
    return [
        Error(f"LIMITER_AUTHZ_MIN_COST {problem}", id="policies.E006")
        for problem in min_cost_problems(settings.LIMITER_AUTHZ_MIN_COST)
    ]


# The what-if's (policies.services.whatif) and the login form's (limiter_admin/login_limit.py)
# bounds, and the least each may be.
WHATIF_SETTINGS = {
    "LIMITER_CONSOLE_CONCURRENCY": 0,
    "LIMITER_LOGIN_ATTEMPTS": 1,
    "LIMITER_LOGIN_PER_MINUTE": 1,
    "LIMITER_WHATIF_CONCURRENCY": 1,
    "LIMITER_WHATIF_QUEUE": 0,
    "LIMITER_WHATIF_SECONDS": 1,
    "LIMITER_WHATIF_MAX_TENANTS": 1,
    "LIMITER_WHATIF_MAX_RULES": 1,
}


@register("policies")
def check_whatif_settings(app_configs=None, **kwargs) -> list[Error]:
    """policies.E007: the what-if's and the login form's bounds are whole numbers, each at
    least its least."""
    errors = []
    for name, least in WHATIF_SETTINGS.items():
        value = getattr(settings, name)
        if value is None and name == "LIMITER_CONSOLE_CONCURRENCY":
            continue  # unset: half the worker's threads
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            errors.append(
                Error(f"{name} must be a whole number of at least {least}, not {value!r}", id="policies.E007")
            )
    return errors


# The alerts' settings (policies.services.alerts), and the least each may be.
ALERT_SETTINGS = {
    "LIMITER_ALERT_EVERY": 0.0,
    "LIMITER_ALERT_TIMEOUT": 0.1,
    "LIMITER_ALERT_ATTEMPTS": 1,
    "LIMITER_ALERT_BACKOFF": 0.0,
}


@register("policies")
def check_alert_settings(app_configs=None, **kwargs) -> list[Error]:
    """policies.E008: the alerts' cadence, timeout, attempts and backoff are numbers, each at
    least its least (LIMITER_ALERT_ATTEMPTS a whole number)."""
    errors = []
    for name, least in ALERT_SETTINGS.items():
        value = getattr(settings, name)
        whole = isinstance(least, int)
        kind = (int,) if whole else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind) or not value >= least:  # NaN too
            what = "a whole number" if whole else "a number"
            errors.append(Error(f"{name} must be {what} of at least {least:g}, not {value!r}", id="policies.E008"))
    return errors
