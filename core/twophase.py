"""The two-phase decision, written once: phase 1 asks every rule whether the cost fits,
phase 2 takes from all of them or from none.

It works on slots: each names one rule's state for one key and the table that holds it.
The in-process store hands it the dicts its shards keep, under their locks; the Redis store's
optimistic path (plug-in rules with no Lua twin) hands it the states it read under WATCH, in a
`WrittenTable` that remembers what changed, and writes those back in MULTI/EXEC. The Lua in
stores/lua/decide.lua is the same two phases, for rules with a Lua twin.
"""

from __future__ import annotations

from collections.abc import Collection, MutableMapping, Sequence
from typing import Any, NamedTuple

from .decision import NO_SHADOWS, Finding, found
from .rules import DEFER, EPSILON, Rule

INFINITY = float("inf")


class Slot(NamedTuple):
    """One rule's state for one key, where a store keeps it."""

    rule: Rule
    table: MutableMapping[str, Any]  # the states, by name
    name: str  # this state's name in `table`
    floor: float  # what a priority watermark keeps in reserve, in the rule's units
    shadow: bool  # reported when it would deny, never enforced
    per_request: bool  # takes 1 per request, whatever the cost


def decide(slots: Sequence[Slot], cost: float, now: float, lease: str | None) -> Finding:
    """Every rule's attempt, then, if none denies, every take. A shadow rule that would deny
    takes nothing, as if it were enforced. A soft rule (which never denies) is left out of
    `remaining`, and named in `over` when the take leaves it below zero."""
    worst, blocker, shadows, results = 0.0, -1, NO_SHADOWS, []
    for i, (rule, table, name, floor, shadow, per_request) in enumerate(slots):
        result = rule.attempt(table.get(name), now, 1.0 if per_request else cost, floor)
        if result.__class__ is float:  # a wait: this rule does not fit
            if shadow:
                shadows += (i,)
            elif result > worst:
                worst, blocker = result, i
        results.append(result)
    if blocker >= 0:
        rule, table, name = slots[blocker][:3]
        return found(blocker, worst, rule.remaining(table.get(name), now), shadows)
    remaining, over = INFINITY, NO_SHADOWS
    for i, ((rule, table, name, _, shadow, per_request), state) in enumerate(zip(slots, results)):
        if state.__class__ is float:
            continue
        if state is DEFER:
            state = rule.take(table.get(name), now, 1.0 if per_request else cost, lease)
        table[name] = state
        if rule.soft:
            if state[1] < -EPSILON:
                over += (i,)
        elif state[1] < remaining and not shadow:
            remaining = state[1]
    return found(-1, 0.0, remaining, shadows, over)


def denial(slots: Sequence[Slot], blocker: int, wait: float, now: float) -> Finding:
    """The Finding of a denial by `blocker`, whose wait is the longest (the compiled lean
    path's denial, which has read the waits itself)."""
    rule, table, name, _, _, _ = slots[blocker]  # unpacked whole: no slice to make
    return found(blocker, wait, rule.remaining(table.get(name), now))


def reserve(slots: Sequence[Slot], cost: float, now: float, lease: str | None, until: float) -> Finding:
    """`decide`, and when it took, the lease's slots shortened to run out by `until`, when the
    reservation does."""
    finding = decide(slots, cost, now, lease)
    if finding[0] < 0 and lease:
        for rule, table, name, *_ in slots:
            if rule.leased and table.get(name) is not None:
                table[name] = rule.shorten_lease(table[name], lease, until)
    return finding


def release(slots: Sequence[Slot], now: float, lease: str) -> int:
    """Give back what `lease` holds in every leased rule; returns how many gave."""
    released = 0
    for rule, table, name, *_ in slots:
        if not rule.leased:
            continue
        state = rule.release(table.get(name), now, lease)
        if state is not None:
            table[name] = state
            released += 1
    return released


def settle(
    slots: Sequence[Slot], now: float, delta: float, taken_at: float, untaken: Collection[str], lease: str | None
) -> int:
    """A reservation settled: give back (delta < 0) or charge (delta > 0) the difference at
    every rule that counts cost, except those that took nothing (`untaken`: shadow rules that
    would have denied), then release its lease. Returns how many slots were released."""
    if delta:
        for rule, table, name, _, _, per_request in slots:
            if not per_request and name not in untaken:
                _adjust(rule, table, name, now, delta, taken_at)
    return release(slots, now, lease) if lease else 0


def adjust(slots: Sequence[Slot], now: float, delta: float) -> list[float]:
    """Charge (delta > 0) or give back (delta < 0) `delta` at every rule, now, outside any
    reservation (a top-up of credits); returns each rule's balance after."""
    return [_adjust(rule, table, name, now, delta, now) for rule, table, name, *_ in slots]


def _adjust(rule: Rule, table: MutableMapping[str, Any], name: str, now: float, delta: float, taken_at: float) -> float:
    """One rule's state adjusted by `delta` (Rule.adjust); its balance after."""
    state = rule.adjust(table.get(name), now, delta, taken_at)
    if state is None:
        table.pop(name, None)  # as good as no state: a bucket refunded to full
    else:
        table[name] = state
    return rule.balance(state, now)


def explain(slots: Sequence[Slot], cost: float, now: float) -> list[tuple[float, float]]:
    """(wait, remaining) of every rule, consuming nothing."""
    readings = []
    for rule, table, name, floor, _, per_request in slots:
        state = table.get(name)
        readings.append((rule.wait(state, now, 1.0 if per_request else cost, floor), rule.remaining(state, now)))
    return readings


def inspect(slots: Sequence[Slot], now: float) -> list[dict]:
    """The live state of every rule, as each rule describes it."""
    return [rule.inspect(table.get(name), now) for rule, table, name, *_ in slots]


class WrittenTable(dict):
    """States by name that remember which names were written (set, or popped as no state):
    what a store that read them must write back."""

    def __init__(self, states: dict[str, Any]) -> None:
        super().__init__(states)
        self.written: set[str] = set()

    def __setitem__(self, name: str, state: Any) -> None:
        self.written.add(name)
        super().__setitem__(name, state)

    def pop(self, name: str, *default: Any) -> Any:
        self.written.add(name)
        return super().pop(name, *default)
