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
    from django.conf import settings

    if not (settings.REDIS_URL or "").startswith("redis-cluster://"):
        return []
    from core.stores.cluster import check_options, parse_cluster_url

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
    from django.conf import settings

    from core.stores.redis import KEY_FORMATS

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
    from django.conf import settings

    from core.recorder import check_limit

    try:
        check_limit(settings.LIMITER_RECORD_LIMIT)
    except ConfigError as error:
        return [Error(f"LIMITER_RECORD_LIMIT {error.reason}", id="policies.E004")]
    return []


@register("policies")
def check_authz_keys(app_configs=None, **kwargs) -> list[Error]:
    """policies.E005: LIMITER_AUTHZ_KEYS maps level names to request header names."""
    from django.conf import settings

    from .api.authz import authz_keys_problems

    return [
        Error(f"LIMITER_AUTHZ_KEYS {problem}", id="policies.E005")
        for problem in authz_keys_problems(settings.LIMITER_AUTHZ_KEYS)
    ]
