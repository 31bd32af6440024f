"""One way to limit a Django app's own views and paths, with three faces: the `limit`
decorator here, the middleware (policies/middleware.py) and the DRF throttle
(policies/throttling.py). docs/EMBEDDING.md has the examples.

    from policies.embedding import limit

    @limit(rate="10/s")                              # inline: a token bucket per client
    def export(request): ...

    @limit(tier="pro", team=team_of, cost=tokens)   # the console's tier "pro", edited live
    async def chat(request): ...                    # awaited: the event loop goes on

Every face compiles its options into one `Limit` and serves a request with it the same way:

- **Keys** from the request: `key(request)` (default `client_key`: `user:<pk>` when logged
  in, else `ip:<address>`, the address from REMOTE_ADDR or, behind proxies, from the
  LIMITER_IP_HEADER header as LIMITER_IP_PROXIES trusted proxies wrote it); None exempts the
  request. `team(request)` names the tenant. Either may be a coroutine function.
- **Limits** inline (`rate`, `burst`, `rules`: one level, `client`, whose keys are scoped by
  the view or setting so that two limits never share a bucket) or the console's policies
  (`tier`: that tier's rules; else `team`: its tenant's, as the decision API picks them),
  with the key at the user level, the team key at the team level and `*` at the global
  level. A policy edit reaches every worker within a second (policies.compile).
- **The store** is the process's (policies.stores): Redis or a cluster with REDIS_URL, so
  every worker and machine counts in one place, exactly; else this process's memory (one
  process only: the system checks refuse it under several workers, policies.E009).
- **Sync and async**: a sync view decides with `acquire`, a coroutine view with `aacquire`
  (redis-py's asyncio client; a policy read from the database, due twice a second, runs in
  a thread), so neither blocks an event loop.
- **The answer**: a denial is a 429 in the API's error shape with `Retry-After` and the
  RateLimit fields (policies.services.answers), or the `denied_view`'s answer; every answer
  carries the RateLimit fields. `request.limit` is the core.Decision. A cost or key the
  engine refuses is a 400 in the same shape; a policy database never read a 503.
- **The record**: each decision counts in the metrics, the statistics and the usage series
  (policies.services.recording), marked as embedded; one under the console's policies also
  in the what-if record. A concurrency slot a decision took is released when the view returns.
"""

from __future__ import annotations

import functools
import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import DatabaseError
from django.http import HttpResponseBase, JsonResponse
from django.utils.module_loading import import_string

from core import ClientLimiter, ConfigError, Decision, HierarchicalLimiter, InvalidRequest, MemoryStore, Store
from core.single import LEVEL as CLIENT_LEVEL

from .compile import PolicyCache, PolicyUnavailable, policy_cache
from .headers import advertised_policy, limit_item, policy_item, quota_units, retry_after_header, sf_string
from .policy import GLOBAL_LEVEL, TENANT_LEVEL, USER_LEVEL
from .services.answers import RATE_LIMITED, decision_headers, denial_message
from .services.decisions import Decided
from .services.errors import error_body
from .services.forward_auth import GLOBAL_KEY
from .services.inputs import MAX_KEY_LENGTH
from .services.recording import record_embedded, record_release
from .stores import limiter_store

# DRF's rate spelling: "100/min", "5/hour". Only the unit's first letter is read.
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*([smhd])[a-z]*\s*$", re.IGNORECASE)
_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# The fields of LIMITER_THROTTLE (and of LIMITER_MIDDLEWARE, which adds paths and denied_view).
LIMIT_FIELDS = ("rate", "burst", "rules", "policy", "quota", "window", "key", "tier", "team", "cost")
RATELIMIT_LISTS = ("RateLimit-Policy", "RateLimit")
# The faces, as the metrics and the record name them.
DECORATOR, MIDDLEWARE, THROTTLE = "decorator", "middleware", "throttle"

KeyFunction = Callable[[Any], Any]  # request -> str | None, or a coroutine of it


# --- keys from the request ------------------------------------------------------------------


def client_ip(request: Any) -> str:
    """The client's address: REMOTE_ADDR, or behind proxies the LIMITER_IP_HEADER header
    (e.g. "X-Forwarded-For"), read LIMITER_IP_PROXIES entries from its right: each trusted
    proxy appends the address it was called from, so that entry is the one the first of
    them saw. A header with fewer entries did not come through every proxy: REMOTE_ADDR."""
    header = getattr(settings, "LIMITER_IP_HEADER", None)
    if header:
        raw = request.META.get("HTTP_" + header.upper().replace("-", "_"))
        hops = [hop.strip() for hop in raw.split(",") if hop.strip()] if raw else []
        proxies = getattr(settings, "LIMITER_IP_PROXIES", 1)
        if len(hops) >= proxies:
            return hops[-proxies]
    return request.META.get("REMOTE_ADDR") or "unknown"


def _user_key(user: Any) -> str | None:
    if user is not None and getattr(user, "is_authenticated", False):
        ident = getattr(user, "pk", None)
        return f"user:{ident if ident is not None else user}"
    return None


def client_key(request: Any) -> str:
    """`user:<pk>` for an authenticated caller (`user:<name>` for one without a pk, such as
    a service token), else `ip:<address>` (client_ip)."""
    return _user_key(getattr(request, "user", None)) or f"ip:{client_ip(request)}"


async def aclient_key(request: Any) -> str:
    """client_key for a coroutine view: the user through `request.auser()`, which reads the
    session without blocking the event loop."""
    auser = getattr(request, "auser", None)
    user = await auser() if auser is not None else getattr(request, "user", None)
    return _user_key(user) or f"ip:{client_ip(request)}"


def user_key(request: Any) -> str | None:
    """`user:<pk>` for an authenticated caller; None (not limited) for anyone else."""
    return _user_key(getattr(request, "user", None))


def ip_key(request: Any) -> str:
    """`ip:<address>`, logged in or not."""
    return f"ip:{client_ip(request)}"


# --- a compiled limit ------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)  # eq=False: hashed by identity, and cached_property needs a __dict__
class Limit:
    """One face's options, compiled: where its rules come from (`limiter`, inline, or the
    console's `tier` or tenant), how a request is named (`key`, `team`), what it costs, and
    how an answer states the limit. `scope` keeps an inline limit's buckets its own."""

    limiter: ClientLimiter | None  # inline rules at the one level `client`; None: the console's
    name: str
    quota: float | None
    window: float | None
    key: KeyFunction
    paths: tuple[str, ...] = ()
    tier: str | None = None
    team: KeyFunction | None = None
    cost: float | Callable[[Any], Any] = 1
    scope: str = ""
    face: str = THROTTLE
    denied_view: Callable[[Any], Any] | None = None

    @property
    def from_policy(self) -> bool:
        return self.limiter is None

    def decide(self, key: str, cost: float = 1) -> Decision:
        """An inline limit's decision for one client key (this limit's scope added), not
        recorded: `decide_request` is what the faces call."""
        assert self.limiter is not None, "a limit from the console's policies decides by request"
        return self.limiter.limiter.acquire({CLIENT_LEVEL: f"{self.scope}:{key}"}, cost)

    def headers(self, decision: Decision) -> dict[str, str]:
        """An inline limit's RateLimit fields (policies.headers, with the policy's item worked
        out once), and Retry-After on a denial that can ever fit."""
        item, units, policy = self._items
        headers = {"RateLimit-Policy": policy} if policy else {}
        limit = limit_item(decision, item, units)
        if limit is not None:
            headers["RateLimit"] = limit
        if not decision.allowed and math.isfinite(decision.retry_after):
            headers["Retry-After"] = retry_after_header(decision.retry_after)
        return headers

    @functools.cached_property
    def _items(self) -> tuple[str, int | None, str | None]:
        """The name as an sf-string, `q`, and the whole RateLimit-Policy value (None: no quota)."""
        item, units = sf_string(self.name), quota_units(self.quota)
        return item, units, policy_item(item, units, self.window) if units is not None else None

    def answer_headers(self, decided: Decided) -> dict[str, str]:
        """The header fields of an answer: the inline limit's policy, or, under the console's
        policies, the decision API's own (one policy item per rule of the request's levels)."""
        if self.from_policy:
            return decision_headers(decided.limiter, decided.keys, decided.decision)
        return self.headers(decided.decision)

    # --- deciding, sync ---

    def decide_request(self, request: Any, cost: Any = None) -> Decided | None:
        """Decide `request` (and record it); None when its key function exempts it. Raises
        InvalidRequest (a bad cost or key), PolicyUnavailable or DatabaseError."""
        client = _called(self.key, request)
        if client is None:
            return None
        cost = _called(self.cost, request) if cost is None else cost
        if self.from_policy:
            team = _called(self.team, request) if self.team is not None else None
            limiter = self._policy_limiter(policy_cache(), team)
        else:
            team, limiter = None, self._inline_limiter()
        keys = self._keys(limiter, client, team)
        decided = Decided(limiter, keys, limiter.acquire(keys, cost))
        record_embedded(keys, decided.decision, cost, self.face, self.from_policy)
        return decided

    def release(self, decided: Decided) -> None:
        """Hand back the concurrency slot the decision took, if any (the view has returned)."""
        lease = decided.decision.lease
        if lease:
            decided.limiter.release(decided.keys, lease)
            if self.from_policy:
                record_release(decided.keys, lease)

    def serve(self, request: Any, view: Callable, *args: Any, **kwargs: Any) -> HttpResponseBase:
        """Decide, then answer: the view's answer, or the denial; either with the fields."""
        try:
            decided = self.decide_request(request)
        except (InvalidRequest, PolicyUnavailable, DatabaseError) as error:
            return error_response(error)
        if decided is None:
            return view(request, *args, **kwargs)
        request.limit = decided.decision
        if decided.decision.allowed:
            try:
                response = view(request, *args, **kwargs)
            finally:
                self.release(decided)
        elif self.denied_view is not None:
            response = self.denied_view(request)
        else:
            response = rate_limited_response(decided.decision)
        merge_headers(response, self.answer_headers(decided))
        return response

    # --- deciding, async: the same steps, each awaited where it could wait ---

    async def adecide_request(self, request: Any, cost: Any = None) -> Decided | None:
        """decide_request for a coroutine view."""
        client = await _acalled(aclient_key if self.key is client_key else self.key, request)
        if client is None:
            return None
        cost = await _acalled(self.cost, request) if cost is None else cost
        if self.from_policy:
            team = await _acalled(self.team, request) if self.team is not None else None
            cache = policy_cache()
            if cache.due():  # reads the database: in a thread, as Django's ORM asks
                limiter = await sync_to_async(self._policy_limiter)(cache, team)
            else:
                limiter = self._policy_limiter(cache, team)
        else:
            team, limiter = None, self._inline_limiter()
        keys = self._keys(limiter, client, team)
        decided = Decided(limiter, keys, await limiter.aacquire(keys, cost))
        record_embedded(keys, decided.decision, cost, self.face, self.from_policy)
        return decided

    async def arelease(self, decided: Decided) -> None:
        lease = decided.decision.lease
        if lease:
            await decided.limiter.arelease(decided.keys, lease)
            if self.from_policy:
                record_release(decided.keys, lease)

    async def aserve(self, request: Any, view: Callable, *args: Any, **kwargs: Any) -> HttpResponseBase:
        """serve for a coroutine view (or the async middleware chain)."""
        try:
            decided = await self.adecide_request(request)
        except (InvalidRequest, PolicyUnavailable, DatabaseError) as error:
            return error_response(error)
        if decided is None:
            return await view(request, *args, **kwargs)
        request.limit = decided.decision
        if decided.decision.allowed:
            try:
                response = await view(request, *args, **kwargs)
            finally:
                await self.arelease(decided)
        elif self.denied_view is not None:
            response = await _acalled(self.denied_view, request, in_thread=True)
        else:
            response = rate_limited_response(decided.decision)
        merge_headers(response, self.answer_headers(decided))
        return response

    # --- the pieces ---

    def _inline_limiter(self) -> HierarchicalLimiter:
        assert self.limiter is not None
        return self.limiter.limiter

    def _policy_limiter(self, cache: PolicyCache, team: str | None) -> HierarchicalLimiter:
        return cache.limiter_for_tier(self.tier) if self.tier is not None else cache.limiter_for(team)

    def _keys(self, limiter: HierarchicalLimiter, client: Any, team: Any) -> dict[str, str]:
        """The key set: inline, the client in this limit's scope; under the console's
        policies, the client at the user level, the team at the team level (left out when
        None) and `*` at the global level, for the levels the policy has."""
        _check_key(client, "key")
        if not self.from_policy:
            return {CLIENT_LEVEL: f"{self.scope}:{client}"}
        keys = {}
        for level in limiter.levels:
            if level == USER_LEVEL:
                keys[level] = client
            elif level == TENANT_LEVEL and team is not None:
                _check_key(team, "team")
                keys[level] = team
            elif level == GLOBAL_LEVEL:
                keys[level] = GLOBAL_KEY
        return keys


def _check_key(key: Any, field: str) -> None:
    if not isinstance(key, str) or not key:
        raise InvalidRequest(f"must be a non-empty string, not {key!r}", field)
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidRequest(f"must be at most {MAX_KEY_LENGTH} characters", field)


def _called(value: Any, request: Any) -> Any:
    return value(request) if callable(value) else value


async def _acalled(value: Any, request: Any, in_thread: bool = False) -> Any:
    """A value, or what a callable answers for `request`: awaited when it is a coroutine
    function; a plain function is called on the loop (keys and costs are quick, and may not
    touch the database) or, `in_thread`, in a thread (a view)."""
    if not callable(value):
        return value
    if iscoroutinefunction(value):
        return await value(request)
    if in_thread:
        return await sync_to_async(value)(request)
    return value(request)


# --- answers -------------------------------------------------------------------------------


def rate_limited_response(decision: Decision) -> JsonResponse:
    """429 in the API's error shape (the header fields are added by the caller)."""
    return JsonResponse(error_body(RATE_LIMITED, denial_message(decision)), status=429)


def error_response(error: Exception) -> JsonResponse:
    """A request this face could not decide, in the API's error shape: a cost or key the
    engine refused (400, the field named), or no policy to decide with (503)."""
    if isinstance(error, InvalidRequest):
        fields = {error.field: error.reason} if error.field else {}
        return JsonResponse(error_body("invalid", str(error), fields), status=400)
    response = JsonResponse(
        error_body("database_unavailable", "the policy database is unreachable; try again"), status=503
    )
    response["Retry-After"] = "1"
    return response


def merge_headers(target: Any, headers: dict[str, str]) -> None:
    """Set `headers` on a response (or a dict), appending to RateLimit fields already there:
    each is a list, one item per policy."""
    for name, value in headers.items():
        present = target.get(name) if name in RATELIMIT_LISTS else None
        target[name] = f"{present}, {value}" if present else value


# --- compiling options ---------------------------------------------------------------------


def build_limit(
    config: Any,
    setting: str,
    clock: Callable[[], float] | None,
    with_paths: bool = False,
    face: str = THROTTLE,
    store: Store | None = None,
    scope: str | None = None,
    field_name: Callable[[str], str] | None = None,
) -> Limit:
    """Compile one face's options (a setting's dict, or the decorator's arguments) on
    `store` (the process's); ImproperlyConfigured names the bad field
    (`LIMITER_THROTTLE["burst"]`, or as `field_name` spells it). `clock`: the inline
    rules' (None: the store's)."""
    name_of = field_name or (lambda field: f'{setting}["{field}"]')

    def bad(field: str, message: str) -> ImproperlyConfigured:
        return ImproperlyConfigured(f"{name_of(field)}: {message}" if field else f"{setting}: {message}")

    if not isinstance(config, dict):
        raise bad("", f"must be a dict, not {type(config).__name__}")
    # A DRF throttle answers a denial through DRF's exception handler: no view of its own.
    known = LIMIT_FIELDS + (("paths",) if with_paths else ()) + (("denied_view",) if face != THROTTLE else ())
    for field in config:
        if field not in known:
            raise bad(field, f"unknown field (known: {', '.join(known)})")
    limiter, quota, window = _inline(config, setting, clock, store, bad, name_of)
    quota = _optional_number(config, "quota", quota, bad)
    window = _optional_number(config, "window", window, bad)
    name = config.get("policy", "default")
    try:
        sf_string(name)
    except ValueError as error:
        raise bad("policy", str(error)) from None
    cost = config.get("cost", 1)
    if not callable(cost):
        cost = _import(cost, "cost", bad) if isinstance(cost, str) else _cost_number(cost, bad)
    return Limit(
        limiter,
        name,
        quota,
        window,
        _callable(config.get("key"), "key", bad) or client_key,
        _paths(config, bad) if with_paths else (),
        tier=_tier(config, bad),
        team=_callable(config.get("team"), "team", bad),
        cost=cost,
        scope=scope or setting,
        face=face,
        denied_view=_callable(config.get("denied_view"), "denied_view", bad),
    )


def _inline(
    config: dict, setting: str, clock: Callable[[], float] | None, store: Store | None, bad: Callable, name_of: Callable
) -> tuple[ClientLimiter | None, float | None, float | None]:
    """The inline rules' limiter on the store and what it advertises; (None, None, None) for
    a limit from the console's policies (`tier` or `team`)."""
    policy = "tier" in config or "team" in config
    inline = "rate" in config or "rules" in config
    if policy and inline:
        raise bad("", 'give inline limits ("rate" or "rules") or the console\'s ("tier" or "team"), not both')
    if policy:
        for field in ("burst", "quota", "window"):
            if field in config:
                raise bad(field, "goes with inline limits; the console's rules state their own")
        return None, None, None
    specs = _rule_specs(config, bad)
    try:
        limiter = ClientLimiter(specs, store=store if store is not None else limiter_store(), clock=clock)
    except ConfigError as error:
        # The engine names the rule by its level ("client[0].capacity"); the setting's
        # author wrote it under "rules" (or "rate"/"burst", which are one rule).
        where = error.path[len(CLIENT_LEVEL) :] if error.path.startswith(CLIENT_LEVEL) else f".{error.path}"
        field = "rules" if "rules" in config else "rate"
        raise ImproperlyConfigured(f"{name_of(field)}{where.rstrip('.')}: {error.reason}") from None
    quota, window = advertised_policy(limiter.limiter.levels[CLIENT_LEVEL])
    return limiter, quota, window


def _rule_specs(config: dict, bad: Callable) -> list[dict]:
    if ("rules" in config) == ("rate" in config):
        raise bad("", 'give either "rate" (and optionally "burst"), "rules", "tier" or "team"')
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


def _parse_rate(rate: Any, bad: Callable) -> tuple[float, float]:
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


def _optional_number(config: dict, field: str, default: float | None, bad: Callable) -> float | None:
    value = config.get(field, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
        raise bad(field, f"must be a number of at least 0, or None; got {value!r}")
    return value


def _cost_number(cost: Any, bad: Callable) -> float:
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 < cost < math.inf:
        raise bad("cost", f"must be a number greater than 0, a callable or its dotted path; got {cost!r}")
    return cost


def _tier(config: dict, bad: Callable) -> str | None:
    tier = config.get("tier")
    if tier is not None and (not isinstance(tier, str) or not tier):
        raise bad("tier", f"must be the name of a tier, not {tier!r}")
    return tier


def _import(path: str, field: str, bad: Callable) -> Any:
    try:
        return import_string(path)
    except ImportError as error:
        raise bad(field, f"cannot import it: {error}") from None


def _callable(value: Any, field: str, bad: Callable) -> Any:
    """A callable option, given as one or as its dotted path; None when not given."""
    if value is None:
        return None
    if isinstance(value, str):
        value = _import(value, field, bad)
    if not callable(value):
        raise bad(field, f"must be a callable or its dotted path, not {type(value).__name__}")
    return value


def _paths(config: dict, bad: Callable) -> tuple[str, ...]:
    paths = config.get("paths")
    if isinstance(paths, str) or not isinstance(paths, (list, tuple)) or not paths:
        raise bad("paths", 'must be a non-empty list of path prefixes, e.g. ["/api/"]')
    for path in paths:
        if not isinstance(path, str) or not path.startswith("/"):
            raise bad("paths", f"each prefix must be a string starting with '/', got {path!r}")
    return tuple(paths)


# --- compiled once per process, again when a LIMITER_* setting changes ------------------------

# Compiled limits: one per (setting, owner), each face's class and each decorated view its
# own. Built under a lock: two limiters for one setting would be two plan caches for one state.
_limits: dict[tuple[str, object], Limit] = {}
_limits_lock = threading.Lock()


class Clocked(Protocol):
    """A face: its `timer` is the clock of its inline rules (None: the store's, Redis TIME
    or this process's monotonic clock); tests set a ManualClock. `face` names it."""

    timer: Callable[[], float] | None


def compiled(key: tuple[str, object], build: Callable[[], Limit]) -> Limit:
    """The limit compiled under `key`, built by `build` the first time."""
    limit = _limits.get(key)
    if limit is None:
        with _limits_lock:
            limit = _limits.get(key)
            if limit is None:
                limit = _limits[key] = build()
    return limit


def limit_for(owner: Any, setting: str, with_paths: bool = False) -> Limit | None:
    """The compiled `setting` for `owner` (a face's class: its `timer` is the clock, its
    `face` its name); None when the setting is unset."""
    config = getattr(settings, setting, None)
    if not config:
        return None
    clock = (lambda: owner.timer()) if owner.timer is not None else None
    face = getattr(owner, "face", THROTTLE)
    return compiled((setting, owner), lambda: build_limit(config, setting, clock, with_paths, face))


def reset_limits() -> None:
    """Forget every compiled limit: the next request compiles them again from the settings
    (the buckets stay in the store)."""
    with _limits_lock:
        _limits.clear()


def _forget_limits(setting: str, **kwargs: Any) -> None:
    if setting.startswith("LIMITER_") or setting in ("REDIS_URL", "CACHES"):
        reset_limits()


setting_changed.connect(_forget_limits, dispatch_uid="policies.embedding.forget_limits")


# --- the decorator ---------------------------------------------------------------------------


class ViewLimit:
    """The limit of one decorated view: its arguments, checked when the view is decorated
    and compiled on the process's store at its first request. `timer` is the clock of inline
    rules (None: the store's); tests set a ManualClock. Every one made is in DECORATED, for
    the system checks."""

    timer: Callable[[], float] | None = None
    face = DECORATOR

    def __init__(self, config: dict, view_name: str, scope: str) -> None:
        self.config, self.view_name, self.scope = config, view_name, scope
        self.where = f"@limit on {view_name}"
        # Now, on a store of its own: a bad argument fails at import, not at a request.
        self._build(MemoryStore(1))

    def _build(self, store: Store | None = None) -> Limit:
        clock = (lambda: type(self).timer()) if type(self).timer is not None else None  # type: ignore[misc]
        return build_limit(
            self.config,
            self.where,
            clock,
            with_paths=False,
            face=DECORATOR,
            store=store,
            scope=self.scope,
            field_name=lambda field: f"{self.where}: {field}=",
        )

    def limit(self) -> Limit:
        return compiled((self.scope, self), self._build)


DECORATED: list[ViewLimit] = []


def limit(
    rate: Any = None,
    *,
    burst: float | None = None,
    rules: Any = None,
    tier: str | None = None,
    team: Any = None,
    key: Any = None,
    cost: Any = 1,
    policy: str | None = None,
    quota: float | None = None,
    window: float | None = None,
    denied_view: Any = None,
    scope: str | None = None,
) -> Callable[[Callable], Callable]:
    """Limit a function view, sync or async (and a class's handler with `method_decorator`).

    Inline: `rate="10/s"` (and `burst`), or `rules=[{...}]`, per client. From the console:
    `tier="pro"`, or `team=` a callable naming the tenant whose rules apply. `key`: a
    callable (or dotted path) naming the client (default client_key; None exempts), `cost` a
    number or a callable of the request, `denied_view` the view that answers a denial
    instead of the 429, `policy`, `quota`, `window` what the header fields advertise,
    `scope` a name to share an inline limit's buckets between views (default: the view's).
    """
    given = {
        "rate": rate,
        "burst": burst,
        "rules": rules,
        "tier": tier,
        "team": team,
        "key": key,
        "policy": policy,
        "quota": quota,
        "window": window,
        "denied_view": denied_view,
    }
    config = {name: value for name, value in given.items() if value is not None}
    if cost != 1:
        config["cost"] = cost

    def decorate(view: Callable) -> Callable:
        name = f"{view.__module__}.{view.__qualname__}"
        holder = ViewLimit(config, name, scope or name)
        DECORATED.append(holder)
        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def limited_async(request: Any, *args: Any, **kwargs: Any) -> HttpResponseBase:
                return await holder.limit().aserve(request, view, *args, **kwargs)

            limited_async.view_limit = holder  # type: ignore[attr-defined]
            return limited_async

        @functools.wraps(view)
        def limited(request: Any, *args: Any, **kwargs: Any) -> HttpResponseBase:
            return holder.limit().serve(request, view, *args, **kwargs)

        limited.view_limit = holder  # type: ignore[attr-defined]
        return limited

    return decorate


__all__ = [
    "DECORATED",
    "LIMIT_FIELDS",
    "RATELIMIT_LISTS",
    "Clocked",
    "Limit",
    "ViewLimit",
    "aclient_key",
    "build_limit",
    "client_ip",
    "client_key",
    "error_response",
    "ip_key",
    "limit",
    "limit_for",
    "merge_headers",
    "rate_limited_response",
    "reset_limits",
    "user_key",
]
