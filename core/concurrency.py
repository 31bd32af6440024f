"""The concurrency rule: at most `limit` requests in flight per key."""

from __future__ import annotations

import heapq
import math
from typing import Any

from .params import Param, format_number
from .rules import Rule, register
from .twins import LUA_DIR, RedisTwin


@register("concurrency")
class Concurrency(Rule):
    """Each admitted request holds one slot, whatever its cost, until it is released or
    its lease runs out. The lease is what brings back the slot of a client that crashed.

    State, changed in place: [idle_at, room, {lease id: expiry time} of the slots in flight];
    on Redis a sorted set of lease ids scored by their expiry.
    """

    redis_twin = RedisTwin(
        LUA_DIR / "concurrency.lua",
        ("capacity", "lease"),
        encode=lambda rule, state: dict(state[2]),
        decode=lambda rule, raw: [0.0, 0.0, {lease.decode(): expiry for lease, expiry in raw}],
        redis_type="zset",
    )

    leased = True
    counts_requests = True
    limit: int  # the parameters, set from `params`
    lease: float
    scaled_params = ("limit",)
    params = (
        Param("limit", kind="integer", help="Most requests in flight at once.", minimum=1, maximum=1_000_000),
        Param(
            "lease",
            help="Seconds after which an unreleased slot comes back by itself.",
            minimum=0,
            exclusive_minimum=True,
            maximum=86400,
            default=60,
        ),
    )

    def setup(self) -> None:
        self.capacity = float(self.limit)

    def describe(self) -> str:
        return f"concurrency({self.limit}, lease {format_number(self.lease)}s)"

    def _live(self, state: list | None, now: float) -> dict | None:
        if state is None:
            return None
        slots = state[2]
        for lease in [lease for lease, expiry in slots.items() if expiry <= now]:
            del slots[lease]
        return slots

    def wait(self, state: Any, now: float, cost: float, floor: float) -> float:
        slots = self._live(state, now)
        surplus = (len(slots) if slots else 0) + cost + floor - self.capacity
        if surplus <= 0:
            return 0.0
        if cost + floor > self.capacity or not slots:
            return math.inf
        # The slots free up in order of expiry; wait for as many as are needed.
        return heapq.nsmallest(math.ceil(surplus), slots.values())[-1] - now

    def take(self, state: Any, now: float, cost: float, lease: str | None) -> Any:
        if state is None:
            state = [0.0, 0.0, {}]
        self._live(state, now)
        state[2][lease] = now + self.lease
        return self._settle(state)

    def release(self, state: Any, now: float, lease: str) -> Any:
        slots = self._live(state, now)
        if not slots or slots.pop(lease, None) is None:
            return None
        return self._settle(state, now)

    def shorten_lease(self, state: Any, lease: str, until: float) -> Any:
        slots = state[2] if state is not None else None
        if slots and slots.get(lease, until) > until:
            slots[lease] = until
            self._settle(state)
        return state

    def _settle(self, state: list, now: float = 0.0) -> list:
        slots = state[2]
        state[0] = max(slots.values(), default=now)  # idle once the last lease runs out
        state[1] = self.capacity - len(slots)
        return state

    def remaining(self, state: Any, now: float) -> float:
        slots = self._live(state, now)
        return max(0.0, self.capacity - (len(slots) if slots else 0))

    def inspect(self, state: Any, now: float) -> dict:
        slots = self._live(state, now)
        in_flight = len(slots) if slots else 0
        return {
            "in_flight": in_flight,
            "limit": self.limit,
            "remaining": max(0, self.limit - in_flight),
            "full_in": max(slots.values()) - now if slots else 0.0,
        }
