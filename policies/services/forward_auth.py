"""Forward-auth's contract, whatever serves it: which request header carries each level's key
(LIMITER_AUTHZ_KEYS), the global level's fixed key, how a request's header fields become a
key set, the least cost a request may name (LIMITER_AUTHZ_MIN_COST), and whether it takes a
concurrency slot (X-Limiter-Slot, else LIMITER_AUTHZ_SLOTS).
policies/api/authz.py serves it over HTTP; policies.checks checks the settings at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.params import LARGEST_NUMBER

from ..policy import GLOBAL_LEVEL
from .errors import invalid
from .inputs import MAX_KEY_LENGTH, number_from_text

GLOBAL_KEY = "*"
DEFAULT_COST = 1  # what a request that names no cost costs
# RFC 9110's token characters: what a header's name may hold.
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def authz_keys_problems(mapping: Any) -> list[str]:
    """What is wrong with a LIMITER_AUTHZ_KEYS value: it maps level names to header names."""
    if not isinstance(mapping, dict) or not mapping:
        return [f"must be a JSON object mapping level names to header names, not {mapping!r}"]
    problems = []
    for level, header in mapping.items():
        if level == GLOBAL_LEVEL:
            problems.append(f"{level!r}: the global level's key is always {GLOBAL_KEY!r}, from no header")
        elif not isinstance(header, str) or not header or not set(header) <= _TOKEN:
            problems.append(f"{level!r}: {header!r} is not a header name")
    return problems


def keys_from_headers(
    header: Callable[[str], str | None], mapping: dict[str, str], levels: tuple[str, ...]
) -> dict[str, str]:
    """Each mapped level's key from its header (`header(name)` reads one), in the policy's
    level order, and `*` at the global level when the policy has one. Invalid names a
    missing or bad header, or a mapped level the policy does not have."""
    keys = {}
    for level in levels:
        if level == GLOBAL_LEVEL:
            keys[level] = GLOBAL_KEY
            continue
        name = mapping.get(level)
        if name is None:
            continue
        key = header(name)
        if not key:
            raise invalid(name, f"this header is required: it carries the {level} key")
        if len(key) > MAX_KEY_LENGTH:
            raise invalid(name, f"must be at most {MAX_KEY_LENGTH} characters")
        keys[level] = key
    for level, name in mapping.items():
        if level not in levels:
            raise invalid(name, f"LIMITER_AUTHZ_KEYS maps it to level {level!r}, which is not configured")
    return keys


def min_cost_problems(floor: Any) -> list[str]:
    """What is wrong with a LIMITER_AUTHZ_MIN_COST value: a number from 0 (no floor) up."""
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 <= floor <= LARGEST_NUMBER:
        return [f"must be a number from 0 (no floor) to {LARGEST_NUMBER:.0e}, not {floor!r}"]
    return []


def cost_from_header(raw: str | None, field: str, floor: float) -> float:
    """The cost a request names in header `field` (`raw`, None when absent): DEFAULT_COST when
    absent, else a number greater than 0; either way at least `floor` (LIMITER_AUTHZ_MIN_COST).
    A cost below the floor is refused, never raised to it: Invalid naming the header."""
    cost = DEFAULT_COST if raw is None else number_from_text(raw, field)
    if cost >= floor:
        return cost
    if raw is None:
        raise invalid(
            field,
            f"this header is required: the default cost, {DEFAULT_COST}, is below LIMITER_AUTHZ_MIN_COST ({floor:g})",
        )
    raise invalid(field, f"must be at least {floor:g} (LIMITER_AUTHZ_MIN_COST), got {raw.strip()!r}")


# What X-Limiter-Slot may say: take a concurrency slot (1) or not (0).
SLOT_WORDS = {"1": True, "0": False}


def slot_from_header(raw: str | None, field: str, default: bool) -> bool:
    """Whether a forward-auth request takes a concurrency slot: what header `field` says
    (`raw`: "1" or "0"), else `default` (LIMITER_AUTHZ_SLOTS, off unless set). A stock
    gateway (nginx, Caddy) cannot give a slot back when the response ends, and a stock
    upstream never does: a slot it took would be held until its lease ran out, and a few
    such requests would lock the tenant out. So a slot is taken only when the gateway asks,
    for an upstream that releases it (POST /api/v1/leases/<lease>/release)."""
    if raw is None:
        return default
    taken = SLOT_WORDS.get(raw.strip())
    if taken is None:
        raise invalid(field, f"must be 1 (take a concurrency slot) or 0 (take none), got {raw.strip()[:40]!r}")
    return taken
