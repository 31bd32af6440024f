"""Envoy's rate limit protocol (envoy.service.ratelimit.v3) mapped onto our levels, once for
the gRPC service (policies/rls_service.py) and POST /api/v1/rls/json (policies/api/rls.py,
the JSON contract of envoyproxy/ratelimit: protojson in and out, 200 under the limit, 429
over). Transport-free: it reads a RateLimitRequest message and builds a RateLimitResponse.

A RateLimitRequest is one decision:

- `domain` must be LIMITER_RLS_DOMAIN;
- in each descriptor, an entry whose key is a configured level gives that level's key, and
  an entry `priority` names a priority class; any other entry key is an unknown level;
- the cost is the descriptor's `hits_addend` when set, else the request's (0 there: 1).
  A descriptor whose cost is 0 is only checked: would a cost of 1 fit now? It takes nothing;
- the descriptors' keys together are one key set (the `team` entry picks the tenant), decided
  at once: every rule of every level allowed, or nothing taken anywhere. So two descriptors
  may not give one level two keys, nor ask for different costs above 0 (INVALID_ARGUMENT:
  such a request is not one decision).

A request whose descriptors carry a `lease` entry (one each, and nothing else) is no decision:
it gives back the concurrency slots of those tickets, as POST /api/v1/leases/<ticket>/release
does. Envoy sends it when a stream ends (a rate limit with `apply_on_stream_done`, whose
descriptor is the `x-limiter-lease` request header that the decision's answer added), so a
slot comes back when the response is done, whatever the upstream. Each descriptor is answered
OK, whether a slot was held or not (released already, run out, a ticket of another key).

The answer to a decision has one DescriptorStatus per descriptor, in order: OVER_LIMIT for the descriptor
whose level blocked, with the wait as `duration_until_reset`; `current_limit` is the rule the
`RateLimit` field names among the descriptor's levels, in the largest unit in which its quota
is a whole number per unit (none for a rule with no window, such as concurrency);
`limit_remaining` is the decision's `remaining`. The header fields are the REST answer's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from time import perf_counter
from typing import Any, NamedTuple

from django.conf import settings
from envoy.config.core.v3 import base_pb2
from envoy.service.ratelimit.v3 import rls_pb2

from core import Decision, HierarchicalLimiter
from core.decision import allowed
from core.params import LARGEST_NUMBER

from ..compile import policy_cache
from ..policy import TENANT_LEVEL
from .answers import binding_quota, decision_headers
from .errors import invalid
from .inputs import MAX_KEY_LENGTH, parse_priority
from .leases import MAX_TICKET, TICKET_HEADER, release, ticket
from .recording import observe_seconds, record

Response = rls_pb2.RateLimitResponse
PRIORITY_ENTRY = "priority"
LEASE_ENTRY = "lease"  # a ticket to give back: the request releases, it decides nothing
MAX_DESCRIPTORS = 64
# Envoy's units, with their seconds: the largest that fits a quota's window is chosen.
UNITS = (
    (Response.RateLimit.YEAR, 365 * 86400.0),
    (Response.RateLimit.MONTH, 30 * 86400.0),
    (Response.RateLimit.WEEK, 7 * 86400.0),
    (Response.RateLimit.DAY, 86400.0),
    (Response.RateLimit.HOUR, 3600.0),
    (Response.RateLimit.MINUTE, 60.0),
    (Response.RateLimit.SECOND, 1.0),
)
UINT32_MAX = 2**32 - 1


class Asked(NamedTuple):
    """A RateLimitRequest, checked: each descriptor's levels and cost, and the key set."""

    levels: list[tuple[str, ...]]  # each descriptor's levels, in the order of its entries
    costs: list[int]
    keys: dict[str, str]  # every descriptor's keys together
    cost: int  # the cost taken at the levels of descriptors with a cost above 0 (0: none)
    priority: str | None


def parse_request(request: Any, policy: Any) -> Asked:
    """Check a RateLimitRequest against the policy; Invalid naming the field otherwise, which
    the gRPC service answers as INVALID_ARGUMENT with the same message (the JSON form: 400)."""
    check_envelope(request)
    default_cost = request.hits_addend or 1  # unset (0) means 1, as Envoy defines it
    configured = ", ".join(policy.levels) or "none"
    keys: dict[str, str] = {}
    where: dict[str, int] = {}  # which descriptor gave each level its key
    levels, costs = [], []
    priorities: set[str] = set()
    for i, descriptor in enumerate(request.descriptors):
        path = f"descriptors[{i}]"
        named: list[str] = []
        for j, entry in enumerate(descriptor.entries):
            field = f"{path}.entries[{j}]"
            if entry.key == PRIORITY_ENTRY:
                priorities.add(parse_priority(entry.value, policy.priorities, f"{field}.value") or "")
                continue
            if entry.key not in policy.levels:
                raise invalid(f"{field}.key", f"unknown level {entry.key!r} (configured: {configured}, or priority)")
            _check_key(entry.value, f"{field}.value")
            if entry.key in keys and keys[entry.key] != entry.value:
                raise invalid(
                    f"{field}.value",
                    f"level {entry.key!r} has key {keys[entry.key]!r} in descriptors[{where[entry.key]}]: "
                    "the descriptors of one request are one decision, one key per level",
                )
            keys[entry.key] = entry.value
            where.setdefault(entry.key, i)
            if entry.key not in named:
                named.append(entry.key)
        if not named:
            raise invalid(f"{path}.entries", f"must name at least one level (configured: {configured})")
        cost = descriptor.hits_addend.value if descriptor.HasField("hits_addend") else default_cost
        if cost > LARGEST_NUMBER:
            raise invalid(f"{path}.hits_addend", f"must be a whole number from 0 to {LARGEST_NUMBER:.0e}, got {cost}")
        levels.append(tuple(named))
        costs.append(cost)
    taking = sorted({cost for cost in costs if cost > 0})
    if len(taking) > 1:
        raise invalid("descriptors", f"ask for different costs {taking}: one request takes one cost at every level")
    if len(priorities) > 1:
        raise invalid("descriptors", f"name different priorities {sorted(priorities)}: one request has one")
    return Asked(levels, costs, keys, taking[0] if taking else 0, priorities.pop() if priorities else None)


def check_envelope(request: Any) -> None:
    """The domain, and a number of descriptors from 1 to MAX_DESCRIPTORS; Invalid otherwise."""
    domain = settings.LIMITER_RLS_DOMAIN
    if request.domain != domain:
        raise invalid("domain", f"must be {domain!r} (LIMITER_RLS_DOMAIN), got {request.domain!r}")
    if not request.descriptors:
        raise invalid("descriptors", "must hold at least one descriptor")
    if len(request.descriptors) > MAX_DESCRIPTORS:
        raise invalid("descriptors", f"at most {MAX_DESCRIPTORS} descriptors, got {len(request.descriptors)}")


def tickets_to_release(request: Any) -> list[str] | None:
    """The lease tickets a request gives back, one `lease` entry per descriptor; None when it
    carries none (a decision). Invalid for a request that mixes the two, or an empty ticket."""
    if not any(entry.key == LEASE_ENTRY for descriptor in request.descriptors for entry in descriptor.entries):
        return None
    tickets = []
    for i, descriptor in enumerate(request.descriptors):
        entries = descriptor.entries
        if len(entries) != 1 or entries[0].key != LEASE_ENTRY:
            raise invalid(
                f"descriptors[{i}].entries",
                f"a request that gives slots back holds one {LEASE_ENTRY!r} entry per descriptor and nothing "
                "else: a slot is given back apart from any decision (Envoy: apply_on_stream_done)",
            )
        value = entries[0].value
        if not value or len(value) > MAX_TICKET:
            field = f"descriptors[{i}].entries[0].value"
            raise invalid(field, f"must be a lease ticket of 1 to {MAX_TICKET} characters")
        tickets.append(value)
    return tickets


def _check_key(value: str, field: str) -> None:
    if not value:
        raise invalid(field, "must be a non-empty string")
    if len(value) > MAX_KEY_LENGTH:
        raise invalid(field, f"must be at most {MAX_KEY_LENGTH} characters")


class RlsAnswer(NamedTuple):
    """What the transports send: the response, and the decision it reports (for their status)."""

    response: Any  # rls_pb2.RateLimitResponse
    decision: Decision


def should_rate_limit(request: Any, endpoint: str | None = "rls") -> RlsAnswer:
    """Decide a RateLimitRequest (see the module), record it, and build the response; its
    time goes to limiter_decision_seconds{endpoint} (None: the caller times it)."""
    start = perf_counter()
    try:
        check_envelope(request)
        tickets = tickets_to_release(request)
        if tickets is not None:
            return RlsAnswer(_released(tickets), RELEASED)
        cache = policy_cache()
        asked = parse_request(request, cache.current())
        limiter = cache.limiter_for(asked.keys.get(TENANT_LEVEL))
        decision, decided = _decide(limiter, asked)
        return RlsAnswer(_response(limiter, asked, decided, decision), decision)
    finally:
        if endpoint is not None:
            observe_seconds(endpoint, perf_counter() - start)


# What a release answers the transports with: it denies nothing.
RELEASED = allowed(math.inf)


def _released(tickets: list[str]) -> Any:
    """Give back each ticket's slots; every descriptor is answered OK, held or not."""
    for held in tickets:
        release(held)
    return Response(overall_code=Response.OK, statuses=[Response.DescriptorStatus(code=Response.OK) for _ in tickets])


def _decide(limiter: HierarchicalLimiter, asked: Asked) -> tuple[Decision, dict[str, str]]:
    """The decision, and the key set it was made on. The checked-only levels are read first
    (nothing taken); when they fit, the others are decided as one acquire."""
    taken = {level for levels, cost in zip(asked.levels, asked.costs) if cost > 0 for level in levels}
    checked = {level: key for level, key in asked.keys.items() if level not in taken}
    if checked:
        decision = limiter.explain(checked, 1, asked.priority)[0]
        if not decision.allowed or not taken:
            return decision, checked
    keys = {level: key for level, key in asked.keys.items() if level in taken}
    decision = limiter.acquire(keys, asked.cost, asked.priority)
    record(keys, decision, asked.cost, asked.priority)
    return decision, keys


def _response(limiter: HierarchicalLimiter, asked: Asked, keys: Mapping[str, str], decision: Decision) -> Any:
    blocking = decision.blocked_by.split(":", 1)[0] if decision.blocked_by else None
    statuses = []
    for levels in asked.levels:
        status = Response.DescriptorStatus(code=Response.OK)
        over = not decision.allowed and blocking in levels
        if over:
            status.code = Response.OVER_LIMIT
            if math.isfinite(decision.retry_after):
                status.duration_until_reset.FromNanoseconds(round(decision.retry_after * 1e9))
        quota = binding_quota(limiter, levels, decision)
        if quota is not None:
            limit = current_limit(*quota)
            if limit is not None:
                status.current_limit.CopyFrom(limit)
        if math.isfinite(decision.remaining):
            status.limit_remaining = min(max(0, math.floor(decision.remaining)), UINT32_MAX)
        statuses.append(status)
    headers = decision_headers(limiter, keys, decision)
    response = Response(
        overall_code=Response.OK if decision.allowed else Response.OVER_LIMIT,
        statuses=statuses,
        response_headers_to_add=[base_pb2.HeaderValue(key=k, value=v) for k, v in headers.items()],
    )
    held = ticket(keys, decision.lease)
    if held is not None:
        # To the upstream, which releases the slot (POST /api/v1/leases/<ticket>/release).
        response.request_headers_to_add.append(base_pb2.HeaderValue(key=TICKET_HEADER, value=held))
    return response


def current_limit(item: str, quota: float, window: float | None) -> Any:
    """A rule's quota as Envoy's RateLimit: `quota` per unit when the window is one unit
    (600 per 60 s: 600 per MINUTE), else the rate in the smallest unit where it is a whole
    number (100 per 10 s: 10 per SECOND); None when the rule has no window (concurrency) or
    no unit fits."""
    if window is None or not (math.isfinite(window) and window > 0) or not math.isfinite(quota):
        return None
    for unit, seconds in UNITS:
        if abs(seconds - window) < 1e-9 * seconds:
            return _limit(item, quota, unit)
    for unit, seconds in reversed(UNITS):
        per_unit = quota * seconds / window
        if per_unit >= 1 and abs(per_unit - round(per_unit)) < 1e-9 * per_unit:
            return _limit(item, per_unit, unit)
    return None


def _limit(item: str, per_unit: float, unit: int) -> Any:
    whole = round(per_unit)
    return Response.RateLimit(name=item, requests_per_unit=whole, unit=unit) if 1 <= whole <= UINT32_MAX else None
