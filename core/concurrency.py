"""The concurrency rule: at most `limit` requests in flight per key."""

from __future__ import annotations

import heapq
import math

from .params import Param, _number
from .rules import Rule, register


@register("concurrency")
class Concurrency(Rule):
    """Each admitted request holds one slot, whatever its cost, until it is released or
    its lease runs out. The lease is what brings back the slot of a client that crashed.

    State: {lease id: expiry time} of the slots in flight.
    """

    leased = True
    counts_requests = True
    params = (
        Param("limit", kind="integer", help="Most requests in flight at once.", minimum=1,
              maximum=1_000_000),
        Param("lease", help="Seconds after which an unreleased slot comes back by itself.",
              minimum=0, exclusive_minimum=True, maximum=86400, default=60),
    )

    def setup(self) -> None:
        self.capacity = float(self.limit)

    def describe(self) -> str:
        return f"concurrency({self.limit}, lease {_number(self.lease)}s)"

    def _live(self, slots: dict | None, now: float) -> dict | None:
        if slots:
            for lease in [lease for lease, expiry in slots.items() if expiry <= now]:
                del slots[lease]
        return slots

    def wait(self, state, now, cost, floor):
        slots = self._live(state, now)
        surplus = (len(slots) if slots else 0) + cost + floor - self.capacity
        if surplus <= 0:
            return 0.0
        if cost + floor > self.capacity:
            return math.inf
        # The slots free up in order of expiry; wait for as many as are needed.
        needed = math.ceil(surplus)
        return heapq.nsmallest(needed, slots.values())[-1] - now

    def take(self, state, now, cost, lease):
        slots = self._live(state, now) or {}
        slots[lease] = now + self.lease
        return slots, max(slots.values())

    def release(self, state, now, lease):
        slots = self._live(state, now)
        if not slots or slots.pop(lease, None) is None:
            return None
        return slots, max(slots.values(), default=now)

    def remaining(self, state, now):
        slots = self._live(state, now)
        return max(0.0, self.capacity - (len(slots) if slots else 0))

    def inspect(self, state, now):
        slots = self._live(state, now)
        in_flight = len(slots) if slots else 0
        return {"in_flight": in_flight, "limit": self.limit,
                "remaining": max(0, self.limit - in_flight),
                "full_in": max(slots.values()) - now if slots else 0.0}
