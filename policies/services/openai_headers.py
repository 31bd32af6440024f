"""OpenAI's rate-limit header fields, for the clients that read them (OpenAI's SDKs, LiteLLM's
router): with LIMITER_OPENAI_HEADERS=1, every answer that carries the RateLimit fields
(`answers.decision_headers`: REST decisions and reservations, forward-auth, Envoy's rate limit
service) carries these too.

    x-ratelimit-limit-requests: 60        x-ratelimit-limit-tokens: 150000
    x-ratelimit-remaining-requests: 59    x-ratelimit-remaining-tokens: 149984
    x-ratelimit-reset-requests: 1s        x-ratelimit-reset-tokens: 6m0s

The `-requests` fields come from the rules of the request's levels that count requests
(`counts: requests`), the `-tokens` fields from those that count the cost, which an LLM
gateway makes the call's tokens. For each kind, the rule with the least room now, after the
decision: `limit` its quota, `remaining` its room (whole, never below 0), `reset` how long
until it is full again, spelt as OpenAI does (`20ms`, `1.5s`, `6m0s`, `1h0m0s`), left out when
it never fills (a bucket that does not refill). A kind with no rule has no fields. Concurrency
rules (slots, not a rate) and shadow rules are not stated.

The rooms are read from the store after the decision, one read per level of the request: that
is the price, and why the fields are off unless asked for. A store that does not answer leaves
them out; the decision stands.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, NamedTuple

from core import HierarchicalLimiter, StoreUnavailable
from policies.headers import rule_quota

KINDS = ("requests", "tokens")


class Room(NamedTuple):
    """One rule's quota, its room now, and the seconds until it is full (None: never)."""

    limit: float
    remaining: float
    reset: float | None


def openai_headers(limiter: HierarchicalLimiter, keys: Mapping[str, str]) -> dict[str, str]:
    """The fields for the request's `keys` (see the module); {} when the store is down."""
    try:
        rooms = rooms_by_kind(limiter, keys)
    except StoreUnavailable:
        return {}
    headers = {}
    for kind, room in rooms.items():
        headers[f"x-ratelimit-limit-{kind}"] = str(whole(room.limit))
        headers[f"x-ratelimit-remaining-{kind}"] = str(whole(room.remaining))
        if room.reset is not None:
            headers[f"x-ratelimit-reset-{kind}"] = duration_text(room.reset)
    return headers


def rooms_by_kind(limiter: HierarchicalLimiter, keys: Mapping[str, str]) -> dict[str, Room]:
    """For each kind, the room of its rule with the least room left (the one that resets last
    among equals); kinds without a rule are absent."""
    tightest: dict[str, Room] = {}
    for level, key in keys.items():
        if key is None or level not in limiter.levels:
            continue
        rules = limiter.levels[level]
        for row in limiter.inspect(level, key):
            rule = rules[row["position"]]
            if rule.shadow or rule.leased:
                continue
            room = room_of(rule, row["state"], partial(wall_now, limiter, rule))
            if room is None:
                continue
            kind = KINDS[0] if rule.counts_requests else KINDS[1]
            held = tightest.get(kind)
            if held is None or (room.remaining, -(room.reset or 0)) < (held.remaining, -(held.reset or 0)):
                tightest[kind] = room
    return tightest


def room_of(rule: Any, state: Mapping[str, Any], now: Callable[[], float] = time.time) -> Room | None:
    """A rule's Room from its inspected state: its `remaining`, and `full_in` (seconds) or
    `resets_at` (epoch seconds, a quota's period end, less the wall-clock time `now()`) for
    the reset. None when the rule has no finite quota or its state tells no room."""
    quota, _ = rule_quota(rule)
    remaining = state.get("remaining")
    if not math.isfinite(quota) or not isinstance(remaining, (int, float)):
        return None
    full_in = state.get("full_in")
    if full_in is None and state.get("resets_at") is not None:
        full_in = max(0.0, state["resets_at"] - now())
    reset = float(full_in) if isinstance(full_in, (int, float)) and math.isfinite(full_in) else None
    return Room(quota, remaining, reset)


def wall_now(limiter: HierarchicalLimiter, rule: Any) -> float:
    """The wall-clock time a calendar rule (a quota) reads: its own clock, which a limiter
    whose clock is no calendar gives it, else the limiter's (an injected one)."""
    wall = getattr(rule, "wall", None)
    return wall() if wall is not None else limiter.clock()


def whole(value: float) -> int:
    """A count as a whole number: rounded down, never below 0."""
    return max(0, math.floor(value)) if math.isfinite(value) else 0


def duration_text(seconds: float) -> str:
    """Seconds as OpenAI spells a reset (Go's durations): `0s`, `20ms`, `1.5s`, `6m0s`,
    `1h2m5s`; rounded up to the millisecond, so that a client that waits that long finds
    the room back."""
    millis = math.ceil(max(0.0, seconds) * 1000 - 1e-6)
    if millis == 0:
        return "0s"
    if millis < 1000:
        return f"{millis}ms"
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    text = f"{millis / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    if minutes:
        return f"{minutes}m{text}"
    return text
