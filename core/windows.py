"""Window-shaped rules: fixed window, the exact sliding-window log and the weighted
sliding-window counter. Each admits at most `limit` cost per `window` seconds."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from .params import Param, format_number
from .rules import EPSILON, Rule, register
from .twins import LUA_DIR, RedisTwin

MIN_WINDOW = 0.001
WINDOW_PARAMS = (
    Param("limit", help="Most cost admitted per window.", minimum=0, exclusive_minimum=True),
    # At least a millisecond: a window's index is now / window, and a shorter window's index
    # passes 2**53 (no longer exact as a float) or, for a denormal window, infinity.
    Param("window", help="Length of the window in seconds.", minimum=MIN_WINDOW, maximum=366 * 86400),
)


class WindowRule(Rule):
    """Shared set-up of the window rules."""

    params = WINDOW_PARAMS
    scaled_params = ("limit",)
    limit: float  # the parameters, set from `params`
    window: float

    def setup(self) -> None:
        self.capacity = float(self.limit)
        self.window = float(self.window)

    def describe(self) -> str:
        return f"{self.type_name}({format_number(self.limit)}/{format_number(self.window)}s)"

    def _over(self, used: float, cost: float, floor: float) -> float:
        """How much cost is over the room left; <= 0 when it fits."""
        return used + cost + floor - self.capacity


@register("fixed_window")
class FixedWindow(WindowRule):
    """Counts cost per aligned window. Cheapest of all, with the known 2x burst where two
    windows meet: `limit` at the end of one window and `limit` again at the start of the next.

    State: (idle_at, room, window index, used); on Redis the string "index used".
    """

    redis_twin = RedisTwin(
        LUA_DIR / "fixed_window.lua",
        ("capacity", "window"),
        encode=lambda rule, state: f"{state[2]!r} {state[3]!r}",
        decode=lambda rule, raw: (0.0, 0.0, *map(float, raw.split())),
    )

    def _used(self, state: Any, now: float) -> tuple[int, float]:
        index = int(now / self.window)  # as Lua's math.floor(now / window)
        if state is None or state[2] != index:
            return index, 0.0
        return index, state[3]

    def wait(self, state: Any, now: float, cost: float, floor: float) -> float:
        index, used = self._used(state, now)
        if self._over(used, cost, floor) <= EPSILON:
            return 0.0
        if cost + floor > self.capacity:
            return math.inf
        return (index + 1) * self.window - now

    def attempt(self, state: Any, now: float, cost: float, floor: float) -> Any:
        index, used = self._used(state, now)
        used += cost
        if used + floor - self.capacity > EPSILON:
            return self.wait(state, now, cost, floor) or EPSILON
        return (index + 1) * self.window, self.capacity - used, index, used

    def adjust(self, state: Any, now: float, delta: float, taken_at: float) -> Any:
        index, used = self._used(state, now)
        if delta > 0:
            used += delta  # into the current window, over the limit if need be
        elif int(taken_at / self.window) == index:
            # Only the window the reservation took from can give back: a later one never
            # counted it.
            used = max(0.0, used + delta)
        if not used:
            return None
        return (index + 1) * self.window, self.capacity - used, index, used

    def remaining(self, state: Any, now: float) -> float:
        return max(0.0, self.capacity - self._used(state, now)[1])

    def inspect(self, state: Any, now: float) -> dict:
        index, used = self._used(state, now)
        return {
            "used": used,
            "limit": self.capacity,
            "remaining": max(0.0, self.capacity - used),
            "full_in": (index + 1) * self.window - now if used else 0.0,
        }


@register("sliding_window")
class SlidingWindowLog(WindowRule):
    """Exact: keeps every (time, cost) in the window. Memory grows with the entries in the
    window, so it suits low limits or coarse costs; the counter below is O(1).

    State, changed in place: [idle_at, room, entries (oldest first)]; on Redis a list of
    "time cost" entries.
    """

    redis_twin = RedisTwin(
        LUA_DIR / "sliding_window.lua",
        ("capacity", "window"),
        encode=lambda rule, state: [f"{stamp!r} {spent!r}" for stamp, spent in state[2]],
        decode=lambda rule, raw: [0.0, 0.0, deque(tuple(map(float, entry.split())) for entry in raw)],
        redis_type="list",
    )

    def _prune(self, log: list | None, now: float) -> list | None:
        # Dropping entries that left the window changes no decision, so it may happen
        # in `wait` too, before the decision is known.
        if log is None:
            return None
        entries, cutoff = log[2], now - self.window
        while entries and entries[0][0] <= cutoff:
            entries.popleft()
        return log

    @staticmethod
    def _used(log: list | None) -> float:
        # Summed afresh, oldest first, exactly as the Lua twin sums it, so that both stores
        # agree to the last bit; the log is O(entries) anyway.
        used = 0.0
        for _, spent in log[2] if log else ():
            used += spent
        return used

    def wait(self, state: Any, now: float, cost: float, floor: float) -> float:
        log = self._prune(state, now)
        over = self._over(self._used(log), cost, floor)
        if over <= EPSILON:
            return 0.0
        if cost + floor > self.capacity or log is None:
            return math.inf
        freed = 0.0
        for stamp, spent in log[2]:  # oldest first: wait until enough of them leave
            freed += spent
            if freed >= over - EPSILON:
                return stamp + self.window - now
        return math.inf

    def take(self, state: Any, now: float, cost: float, lease: str | None) -> Any:
        log = self._prune(state, now) or [0.0, 0.0, deque()]
        log[2].append((now, cost))
        log[0] = now + self.window  # idle once the newest entry has left
        log[1] = self.capacity - self._used(log)
        return log

    def adjust(self, state: Any, now: float, delta: float, taken_at: float) -> Any:
        if delta > 0:
            return self.take(state, now, delta, None)  # a new entry, at now
        log = self._prune(state, now)
        if not log:
            return log
        # Give back from the entries logged at taken_at, newest first (several requests may
        # share an instant; they leave the window together, so which one gives is moot).
        # An entry that already left the window was pruned above: it has nothing to give.
        refund, entries = -delta, log[2]
        for i in range(len(entries) - 1, -1, -1):
            stamp, spent = entries[i]
            if refund <= 0 or stamp < taken_at:
                break
            if stamp == taken_at:
                back = min(refund, spent)
                entries[i] = (stamp, spent - back)
                refund -= back
        log[2] = deque(entry for entry in entries if entry[1] > 0)
        if not log[2]:
            return None
        log[0] = log[2][-1][0] + self.window  # idle once the newest entry has left
        log[1] = self.capacity - self._used(log)
        return log

    def remaining(self, state: Any, now: float) -> float:
        return max(0.0, self.capacity - self._used(self._prune(state, now)))

    def inspect(self, state: Any, now: float) -> dict:
        log = self._prune(state, now)
        used = self._used(log)
        return {
            "used": used,
            "limit": self.capacity,
            "entries": len(log[2]) if log else 0,
            "remaining": max(0.0, self.capacity - used),
            "full_in": log[2][-1][0] + self.window - now if log and log[2] else 0.0,
        }


@register("sliding_window_counter")
class SlidingWindowCounter(WindowRule):
    """Two fixed windows, the previous one weighted by how much of it the sliding window
    still covers. O(1) state: (window index, previous count, current count).

    It assumes the previous window's cost was spread evenly, so it can over-admit when that
    cost came in a burst at the end of the window, by at most the part of the previous
    window's cost that the weight discounts. We accept it for the constant memory.
    On Redis the string "index previous current".
    """

    redis_twin = RedisTwin(
        LUA_DIR / "sliding_window_counter.lua",
        ("capacity", "window"),
        encode=lambda rule, state: f"{state[2]!r} {state[3]!r} {state[4]!r}",
        decode=lambda rule, raw: (0.0, 0.0, *map(float, raw.split())),
    )

    def _counts(self, state: Any, now: float) -> tuple[int, float, float]:
        index = int(now / self.window)  # as Lua's math.floor(now / window)
        if state is None:
            return index, 0.0, 0.0
        _, _, seen, previous, current = state
        if seen == index:
            return index, previous, current
        if seen == index - 1:
            return index, current, 0.0
        return index, 0.0, 0.0

    def _estimate(self, index: int, previous: float, current: float, now: float) -> float:
        weight = 1.0 - (now - index * self.window) / self.window
        return current + previous * weight

    def wait(self, state: Any, now: float, cost: float, floor: float) -> float:
        index, previous, current = self._counts(state, now)
        room = self.capacity - floor
        if self._estimate(index, previous, current, now) + cost <= room + EPSILON:
            return 0.0
        if cost > room:
            return math.inf
        start = index * self.window
        target = room - cost - current
        if target >= 0 and previous > 0:
            # The previous window's weight falls linearly; find where it is small enough.
            return start + self.window * (1.0 - target / previous) - now
        # Only the next window can help: then `current` becomes the weighted previous.
        target = room - cost
        later = self.window * (1.0 - target / current) if current > target else 0.0
        return start + self.window + later - now

    def attempt(self, state: Any, now: float, cost: float, floor: float) -> Any:
        index, previous, current = self._counts(state, now)
        left = self.capacity - self._estimate(index, previous, current, now) - cost
        if left - floor < -EPSILON:
            return self.wait(state, now, cost, floor) or EPSILON
        return (index + 2) * self.window, left, index, previous, current + cost

    def adjust(self, state: Any, now: float, delta: float, taken_at: float) -> Any:
        index, previous, current = self._counts(state, now)
        if delta > 0:
            current += delta
        elif state is None:
            return None
        else:
            # Give back to the window the reservation counted in, while it still counts.
            taken = int(taken_at / self.window)
            if taken == index:
                current = max(0.0, current + delta)
            elif taken == index - 1:
                previous = max(0.0, previous + delta)
        left = self.capacity - self._estimate(index, previous, current, now)
        return (index + 2) * self.window, left, index, previous, current

    def remaining(self, state: Any, now: float) -> float:
        index, previous, current = self._counts(state, now)
        return max(0.0, self.capacity - self._estimate(index, previous, current, now))

    def inspect(self, state: Any, now: float) -> dict:
        index, previous, current = self._counts(state, now)
        estimate = self._estimate(index, previous, current, now)
        full_at = (index + 2) * self.window if current else (index + 1) * self.window
        return {
            "used": estimate,
            "limit": self.capacity,
            "previous": previous,
            "current": current,
            "remaining": max(0.0, self.capacity - estimate),
            "full_in": full_at - now if estimate else 0.0,
        }
