"""System checks: a policy that cannot build a limiter is reported at start-up (`manage.py
check`, `migrate`, `runserver`), not by the first request that needs it; so is an embedded
limiter (policies/embedding.py) that would count per process under several workers, names
a tier the policy does not have, or names a function that does not import."""

from __future__ import annotations

import os
import re

from django.conf import settings
from django.core.checks import Error, Warning, register
from django.db import DatabaseError
from django.urls import get_resolver
from django.utils.module_loading import import_string

from core import ConfigError, MemoryStore
from core.recorder import check_limit
from core.stores.cluster import check_options, parse_cluster_url
from core.stores.redis import KEY_FORMATS

from .compile import read_policy
from .embedding import DECORATED
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


# The settings of the embedded limiter's faces that hold a dict of options.
EMBEDDED_SETTINGS = ("LIMITER_THROTTLE", "LIMITER_MIDDLEWARE")
# Options given as a dotted path to a callable.
CALLABLE_OPTIONS = ("key", "team", "cost", "denied_view")
_WORKERS_FLAG = re.compile(r"(?:^|\s)(?:-w|--workers)(?:=|\s+)(\d+)")


def embedded_limits() -> list[tuple[str, dict]]:
    """(where, options) of every embedded limit: the faces' settings, and every view the
    `limit` decorator wraps (the URLconf is imported, so that its views are decorated)."""
    found = [(name, getattr(settings, name)) for name in EMBEDDED_SETTINGS if getattr(settings, name, None)]
    try:
        get_resolver().url_patterns  # noqa: B018  (importing the views decorates them)
    except Exception:  # Django's own URL check reports a URLconf that does not load
        pass
    return found + [(holder.where, holder.config) for holder in DECORATED]


def served_workers() -> int:
    """How many worker processes the deployment says it runs: WEB_CONCURRENCY (which gunicorn
    and uvicorn both read), or gunicorn's -w/--workers in GUNICORN_CMD_ARGS; 1 when neither."""
    counts = [os.environ.get("WEB_CONCURRENCY", "")]
    counts += _WORKERS_FLAG.findall(os.environ.get("GUNICORN_CMD_ARGS", ""))
    return max([int(count) for count in counts if count.strip().isdigit()], default=1)


@register("policies")
def check_embedded_store(app_configs=None, **kwargs) -> list[Error]:
    """policies.E009: an embedded limit under several workers needs a store they share
    (REDIS_URL): in each process's memory, each worker would let the whole limit through."""
    workers = served_workers()
    if settings.REDIS_URL or workers < 2:
        return []
    limits = embedded_limits()
    if not limits:
        return []
    return [
        Error(
            f"{limits[0][0]} would count in each process's memory: with {workers} workers, each would let "
            f"the whole limit through ({len(limits)} embedded limit{'s' if len(limits) > 1 else ''})",
            hint="Set REDIS_URL, so that every worker counts in one store (docs/EMBEDDING.md).",
            id="policies.E009",
        )
    ]


@register("policies")
def check_embedded_tiers(app_configs=None, **kwargs) -> list[Warning]:
    """policies.W001: a tier an embedded limit names is one the policy has (an unknown one
    falls back to the default tier)."""
    limits = [(where, options["tier"]) for where, options in embedded_limits() if options.get("tier")]
    if not limits:
        return []
    try:
        tiers = read_policy().tiers
    except DatabaseError:
        return []  # no tables yet: nothing to check against
    return [
        Warning(
            f"{where} names the tier {tier!r}, which the policy does not have (known: "
            f"{', '.join(sorted(tiers)) or 'none'}); it is limited by the default tier meanwhile",
            hint="Create the tier in the console, or name one it has.",
            id="policies.W001",
        )
        for where, tier in limits
        if tier not in tiers
    ]


@register("policies")
def check_embedded_callables(app_configs=None, **kwargs) -> list[Warning]:
    """policies.W002: the functions an embedded limit's settings name by dotted path import
    (a throttle would otherwise fail at its first request)."""
    problems = []
    for where, options in embedded_limits():
        for option in CALLABLE_OPTIONS:
            path = options.get(option) if isinstance(options, dict) else None
            if not isinstance(path, str):
                continue
            try:
                import_string(path)
            except ImportError as error:
                problems.append(Warning(f'{where}["{option}"]: cannot import {path!r}: {error}', id="policies.W002"))
    return problems


@register("policies")
def check_ip_settings(app_configs=None, **kwargs) -> list[Error]:
    """policies.E010: LIMITER_IP_HEADER is a header name or unset, LIMITER_IP_PROXIES a whole
    number of proxies, at least 1."""
    errors = []
    header = settings.LIMITER_IP_HEADER
    if header is not None and (not isinstance(header, str) or not re.fullmatch(r"[A-Za-z0-9-]+", header)):
        errors.append(Error(f"LIMITER_IP_HEADER must be a header name or None, not {header!r}", id="policies.E010"))
    proxies = settings.LIMITER_IP_PROXIES
    if isinstance(proxies, bool) or not isinstance(proxies, int) or proxies < 1:
        errors.append(
            Error(f"LIMITER_IP_PROXIES must be a whole number of at least 1, not {proxies!r}", id="policies.E010")
        )
    return errors
