"""A DRF throttle on the in-process engine (seed 001's `allow_request`, per client).

    REST_FRAMEWORK = {"DEFAULT_THROTTLE_CLASSES": ["policies.throttling.LimiterThrottle"], ...}
    # or, on one view:  throttle_classes = [LimiterThrottle]

Settings (the middleware, policies/middleware.py, reads the same shape from
`LIMITER_MIDDLEWARE`, plus `paths`):

    LIMITER_THROTTLE = {
        "rate": "10/s",         # a token bucket refilling at this rate: "N/s", "N/min",
                                # "N/hour", "N/day" (DRF's spelling: the unit's first letter
                                # counts), or a number per second
        "burst": 20,            # optional: the bucket's capacity, the most at once
                                # (default: N, the rate's count)
        # instead of rate and burst, any engine rule specs, all applied (seed 001's shape):
        # "rules": [{"type": "sliding_window", "limit": 100, "window": 60}],
        "policy": "default",    # optional: the name in RateLimit-Policy and RateLimit
        "quota": 20,            # optional: the advertised quota and window (seconds); by
        "window": 2,            # default those of the rule with the smallest capacity
                                # (a bucket's window: its time to refill from empty)
        "key": "myapp.limits.client_key",  # optional: callable(request) -> str | None,
                                # a dotted path or the callable; None means "not limited".
                                # Default: `client_key` below
    }

Each client (`client_key`: `user:<pk>` when authenticated, else `ip:<REMOTE_ADDR>`) has its
own buckets in a MemoryStore of this process. Under several worker processes each keeps its
own, so the effective limit is the setting times the number of workers (seed 001's scope;
the REST API's limits are the shared, exact ones). X-Forwarded-For is not read: behind a
proxy, give a `key` that trusts exactly your proxies.

A denial returns False and `wait()` the whole seconds to wait, the BaseThrottle contract:
DRF raises Throttled, and the project's exception handler (`REST_FRAMEWORK
["EXCEPTION_HANDLER"] = "policies.api.errors.handle_exception"`) answers 429 in the API's
error shape, `{"error": {"code": "rate_limited", ...}}`, with `Retry-After`. Every answer
of the view, allowed or not, carries `RateLimit-Policy` and `RateLimit` (policies/headers.py):
the throttle puts them in `view.headers`, which DRF's `finalize_response` copies onto the
response, whatever the exception handler. Several limiter throttles on one view list their
policies side by side, as the draft's fields allow.

`timer` is the clock, injected like DRF's own throttles': tests set it to a ManualClock.
The limiter is built on first use and rebuilt when a `LIMITER_*` setting changes.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string
from rest_framework.throttling import BaseThrottle

from core import ClientLimiter, ConfigError, Decision, MemoryStore
from core.single import LEVEL as CLIENT_LEVEL

from .headers import advertised_policy, ratelimit_headers, retry_after_header, sf_string

# DRF's rate spelling: "100/min", "5/hour". Only the unit's first letter is read.
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*([smhd])[a-z]*\s*$", re.IGNORECASE)
_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
LIMIT_FIELDS = ("rate", "burst", "rules", "policy", "quota", "window", "key")
RATELIMIT_LISTS = ("RateLimit-Policy", "RateLimit")


def client_key(request) -> str:
    """`user:<pk>` for an authenticated caller (`user:<name>` for one without a pk, such as
    a service token), else `ip:<REMOTE_ADDR>`."""
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        ident = getattr(user, "pk", None)
        return f"user:{ident if ident is not None else user}"
    return f"ip:{request.META.get('REMOTE_ADDR') or 'unknown'}"


@dataclass(frozen=True)
class Limit:
    """One compiled setting: the limiter, the policy it advertises, and how clients are named."""

    limiter: ClientLimiter
    name: str
    quota: float | None
    window: float | None
    key: Callable[[Any], str | None]
    paths: tuple[str, ...] = ()

    def decide(self, key: str, cost: float = 1) -> Decision:
        return self.limiter.decide(key, cost)

    def headers(self, decision: Decision) -> dict[str, str]:
        """The RateLimit fields, and Retry-After on a denial that can ever fit."""
        headers = ratelimit_headers(decision, self.quota, self.window, self.name)
        if not decision.allowed and math.isfinite(decision.retry_after):
            headers["Retry-After"] = retry_after_header(decision.retry_after)
        return headers


def merge_headers(target, headers: dict[str, str]) -> None:
    """Set `headers` on a response (or a dict), appending to RateLimit fields already there:
    each is a list, one item per policy."""
    for name, value in headers.items():
        present = target.get(name) if name in RATELIMIT_LISTS else None
        target[name] = f"{present}, {value}" if present else value


def denial_message(decision: Decision) -> str:
    if not math.isfinite(decision.retry_after):
        return "Too many requests: this request can never fit the rate limit."
    seconds = retry_after_header(decision.retry_after)
    return f"Too many requests; try again in {seconds} second{'' if seconds == '1' else 's'}."


# Compiled limits, one per (setting, owner class), so each throttle or middleware class has
# buckets of its own. Built under a lock: two limiters for one setting would split its state.
_limits: dict[tuple[str, type], Limit] = {}
_limits_lock = threading.Lock()


class Clocked(Protocol):
    """A throttle or middleware class: its `timer` is the clock its limit reads."""

    timer: Callable[[], float]


def limit_for(owner: type[Clocked], setting: str, with_paths: bool = False) -> Limit | None:
    """The compiled `setting` for `owner` (whose `timer` is the clock); None when unset."""
    limit = _limits.get((setting, owner))
    if limit is None:
        config = getattr(settings, setting, None)
        if not config:
            return None
        with _limits_lock:
            limit = _limits.get((setting, owner))
            if limit is None:
                limit = _limits[(setting, owner)] = build_limit(config, setting, lambda: owner.timer(), with_paths)
    return limit


def reset_limits() -> None:
    """Forget every compiled limit, and so every client's buckets."""
    with _limits_lock:
        _limits.clear()


def _forget_limits(setting: str, **kwargs) -> None:
    if setting.startswith("LIMITER_"):
        reset_limits()


setting_changed.connect(_forget_limits, dispatch_uid="policies.throttling.forget_limits")


def build_limit(config: Any, setting: str, clock: Callable[[], float], with_paths: bool = False) -> Limit:
    """Compile one setting; ImproperlyConfigured names the bad field (`LIMITER_THROTTLE["burst"]`)."""

    def bad(field: str, message: str) -> ImproperlyConfigured:
        return ImproperlyConfigured(f'{setting}["{field}"]: {message}' if field else f"{setting}: {message}")

    if not isinstance(config, dict):
        raise bad("", f"must be a dict, not {type(config).__name__}")
    known = LIMIT_FIELDS + (("paths",) if with_paths else ())
    for field in config:
        if field not in known:
            raise bad(field, f"unknown field (known: {', '.join(known)})")
    specs = _rule_specs(config, bad)
    try:
        limiter = ClientLimiter(specs, store=MemoryStore(), clock=clock)
    except ConfigError as error:
        # The engine names the rule by its level ("client[0].capacity"); the setting's
        # author wrote it under "rules" (or "rate"/"burst", which are one rule).
        where = error.path[len(CLIENT_LEVEL) :] if error.path.startswith(CLIENT_LEVEL) else f".{error.path}"
        field = "rules" if "rules" in config else "rate"
        raise ImproperlyConfigured(f'{setting}["{field}"]{where.rstrip(".")}: {error.reason}') from None
    quota, window = advertised_policy(limiter.limiter.levels[CLIENT_LEVEL])
    quota = _optional_number(config, "quota", quota, bad)
    window = _optional_number(config, "window", window, bad)
    name = config.get("policy", "default")
    try:
        sf_string(name)
    except ValueError as error:
        raise bad("policy", str(error)) from None
    return Limit(
        limiter, name, quota, window, _key_function(config.get("key"), bad), _paths(config, bad) if with_paths else ()
    )


def _rule_specs(config: dict, bad) -> list[dict]:
    if ("rules" in config) == ("rate" in config):
        raise bad("", 'give either "rate" (and optionally "burst") or "rules"')
    if "rules" in config:
        if "burst" in config:
            raise bad("burst", 'goes with "rate"; with "rules" give each rule its own capacity')
        rules = config["rules"]
        if isinstance(rules, dict):
            return [rules]
        if isinstance(rules, (list, tuple)) and rules:
            return list(rules)
        raise bad("rules", "must be a rule spec or a non-empty list of them")
    count, period = _parse_rate(config["rate"], bad)
    burst = config.get("burst", count)
    if isinstance(burst, bool) or not isinstance(burst, (int, float)) or not 0 < burst < math.inf:
        raise bad("burst", f"must be a number greater than 0, got {burst!r}")
    return [{"type": "token_bucket", "capacity": burst, "per_second": count / period}]


def _parse_rate(rate: Any, bad) -> tuple[float, float]:
    """`"100/min"` -> (100, 60); a number is per second."""
    if isinstance(rate, (int, float)) and not isinstance(rate, bool):
        count, period = float(rate), 1.0
    else:
        found = _RATE.match(rate) if isinstance(rate, str) else None
        if found is None:
            raise bad(
                "rate",
                f'must look like "10/s", "100/min", "1000/hour" or "5/day", or be a number per second; got {rate!r}',
            )
        count, period = float(found.group(1)), float(_PERIODS[found.group(2).lower()])
    if not 0 < count < math.inf:
        raise bad("rate", f"must be greater than 0, got {rate!r}")
    return count, period


def _optional_number(config: dict, field: str, default: float | None, bad) -> float | None:
    value = config.get(field, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
        raise bad(field, f"must be a number of at least 0, or None; got {value!r}")
    return value


def _key_function(key: Any, bad) -> Callable[[Any], str | None]:
    if key is None:
        return client_key
    if isinstance(key, str):
        try:
            key = import_string(key)
        except ImportError as error:
            raise bad("key", f"cannot import it: {error}") from None
    if not callable(key):
        raise bad("key", f"must be a callable or its dotted path, not {type(key).__name__}")
    return key


def _paths(config: dict, bad) -> tuple[str, ...]:
    paths = config.get("paths")
    if isinstance(paths, str) or not isinstance(paths, (list, tuple)) or not paths:
        raise bad("paths", 'must be a non-empty list of path prefixes, e.g. ["/api/"]')
    for path in paths:
        if not isinstance(path, str) or not path.startswith("/"):
            raise bad("paths", f"each prefix must be a string starting with '/', got {path!r}")
    return tuple(paths)


class LimiterThrottle(BaseThrottle):
    """Limits each client by the `LIMITER_THROTTLE` setting (see the module docstring).
    Subclass to give another view its own limits: `setting = "LIMITER_UPLOAD_THROTTLE"`,
    or a cost per request with `get_cost()`."""

    setting = "LIMITER_THROTTLE"
    timer = time.monotonic
    cost = 1

    decision: Decision | None = None

    @classmethod
    def limit(cls) -> Limit:
        limit = limit_for(cls, cls.setting)
        if limit is None:
            raise ImproperlyConfigured(
                f'{cls.__name__} needs the {cls.setting} setting (e.g. {{"rate": "10/s", "burst": 20}})'
            )
        return limit

    def get_cost(self, request, view) -> float:
        return self.cost

    def allow_request(self, request, view) -> bool:
        limit = self.limit()
        key = limit.key(request)
        if key is None:
            return True
        self.decision = decision = limit.decide(key, self.get_cost(request, view))
        headers = getattr(view, "headers", None)  # what finalize_response copies onto the answer
        if isinstance(headers, dict):
            merge_headers(headers, ratelimit_headers(decision, limit.quota, limit.window, limit.name))
        return decision.allowed

    def wait(self) -> float | None:
        """Whole seconds until the denied request fits (rounded up, as Retry-After);
        None when it never will."""
        if self.decision is None or self.decision.allowed or not math.isfinite(self.decision.retry_after):
            return None
        return float(retry_after_header(self.decision.retry_after))
