"""The hierarchical limiter: rules at several levels, one atomic check-then-take per decision.

    limiter = HierarchicalLimiter.from_config(config, store=store_from_url("memory://"))
    d = limiter.acquire({"user": "u1", "team": "acme", "global": "*"}, cost=1)

Phase 1 asks every rule at every level named in `keys` how long until `cost` fits; phase 2
takes from every rule only if every answer was 0. A denial consumes nothing anywhere. The
store does both phases in one atomic step, so this holds across threads and processes.
"""

from __future__ import annotations

import itertools
import math
import os
from typing import Any, Callable, Mapping

from .config import PriorityClass, parse_levels, parse_priorities
from .errors import InvalidRequest
from .params import LARGEST_NUMBER
from .rules import Rule
from .stores import Check, MemoryStore, Store

INFINITY = math.inf
NO_NAMES: tuple[str, ...] = ()
OK, RATE_LIMITED, COST_EXCEEDS_LIMIT = "OK", "RATE_LIMITED", "COST_EXCEEDS_LIMIT"
PLAN_CACHE_SIZE = 100_000

_lease_prefix = os.urandom(6).hex()
_lease_numbers = itertools.count(1)


class Decision:
    """The answer to "may this request go?". Read-only by convention."""

    __slots__ = ("allowed", "retry_after", "blocked_by", "reason", "remaining", "degraded",
                 "lease", "shadow_blocked")

    def __init__(self, allowed: bool, retry_after: float = 0.0, blocked_by: str | None = None,
                 reason: str = OK, remaining: float = INFINITY, degraded: bool = False,
                 lease: str | None = None, shadow_blocked: tuple[str, ...] = NO_NAMES) -> None:
        self.allowed = allowed
        self.retry_after = retry_after  # seconds; math.inf when it can never fit
        self.blocked_by = blocked_by  # "level: rule", the rule with the longest wait
        self.reason = reason  # "OK", the blocking rule's label, or RATE_LIMITED
        self.remaining = remaining  # the tightest rule's room after this decision
        self.degraded = degraded  # decided by a fail mode because the store was down
        self.lease = lease  # hand back to release() when a concurrency slot was taken
        self.shadow_blocked = shadow_blocked  # shadow rules that would have denied

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        mine, theirs = self.as_dict(), other.as_dict()
        mine.pop("lease"), theirs.pop("lease")  # lease ids are unique by design
        return mine == theirs

    def __repr__(self) -> str:
        if self.allowed:
            return f"<Decision allowed remaining={self.remaining!r}>"
        return f"<Decision denied {self.reason} by {self.blocked_by!r} retry_after={self.retry_after!r}>"


class Plan:
    """A key set and priority, resolved once: the store's plan plus what names the results."""

    __slots__ = ("store_plan", "checks", "names", "reasons", "max_cost", "too_big",
                 "stateless", "leased")


class HierarchicalLimiter:
    """Rules per level, state in a store, decisions that take from all levels or none."""

    def __init__(self, levels: Mapping[str, list[Rule]], store: Store | None = None,
                 clock: Callable[[], float] | None = None,
                 priorities: Mapping[str, PriorityClass] | None = None) -> None:
        self.levels = dict(levels)
        self.store = store if store is not None else MemoryStore()
        self.clock = clock if clock is not None else self.store.clock
        self.priorities = dict(priorities or {})
        self._level_names = tuple(self.levels)
        self._plans: dict[Any, Plan] = {}

    @classmethod
    def from_config(cls, config: Mapping, store: Store | None = None,
                    clock: Callable[[], float] | None = None,
                    priorities: Mapping | None = None) -> "HierarchicalLimiter":
        """Build from `{level: [rule specs]}`; bad config raises ConfigError naming the field."""
        levels = parse_levels(config)
        return cls(levels, store, clock, parse_priorities(priorities, tuple(levels)))

    def acquire(self, keys: Mapping[str, str], cost: float = 1, priority: str | None = None) -> Decision:
        """Decide one request: take `cost` at every level named in `keys`, or nothing at all."""
        if cost.__class__ not in (int, float) or not 0 < cost <= LARGEST_NUMBER:
            _refuse_cost(cost)
        try:
            plan = self._plans[tuple(map(keys.get, self._level_names)), priority]
        except (KeyError, AttributeError, TypeError):
            plan = self._plan(keys, priority)
        if cost > plan.max_cost:
            return self._too_big(plan)
        now = self.clock()
        if plan.stateless:
            denial = self._check_stateless(plan, cost, now)
            if denial is not None:
                return denial
        lease = f"{_lease_prefix}-{next(_lease_numbers):x}" if plan.leased else None
        blocker, wait, remaining, shadows = self.store.decide(plan.store_plan, cost, now, lease)
        names = plan.names
        shadow_blocked = tuple([names[i] for i in shadows]) if shadows else NO_NAMES
        if blocker < 0:
            return Decision(True, 0.0, None, OK, remaining, False, lease, shadow_blocked)
        return Decision(False, wait, names[blocker], plan.reasons[blocker], remaining, False,
                        None, shadow_blocked)

    def explain(self, keys: Mapping[str, str], cost: float = 1,
                priority: str | None = None) -> tuple[Decision, list[dict]]:
        """A dry run: the decision `acquire` would make now, and every rule's wait and
        remaining (before any take), consuming nothing."""
        if cost.__class__ not in (int, float) or not 0 < cost <= LARGEST_NUMBER:
            _refuse_cost(cost)
        return self._explain(self._plan(keys, priority), cost, self.clock())

    def _explain(self, plan: Plan, cost: float, now: float) -> tuple[Decision, list[dict]]:
        found = self.store.explain(plan.store_plan, cost, now)
        rows = [_row(check, wait, left) for check, (wait, left) in zip(plan.checks, found)]
        rows += [_row(check, rule.wait_for_key(check.key, now, cost))
                 for check, _, rule in plan.stateless]
        if cost > plan.max_cost:
            return self._too_big(plan), rows
        return _decision_from_rows(rows), rows

    def inspect(self, level: str, key: str) -> list[dict]:
        """The live state of every rule that applies to `key` at `level`."""
        plan = self._plan({level: key}, None)
        states = self.store.inspect(plan.store_plan, self.clock())
        return [{**_row(check), "state": state} for check, state in zip(plan.checks, states)]

    def release(self, keys: Mapping[str, str], lease: str) -> int:
        """Hand back the concurrency slots that `lease` holds; returns how many rules gave one."""
        plan = self._plan(keys, None)
        return self.store.release(plan.store_plan, self.clock(), lease) if plan.leased else 0

    def reset(self, level: str, key: str) -> None:
        """Forget every rule's state for `key` at `level`: its buckets start full."""
        self.store.reset(self._plan({level: key}, None).store_plan)

    def _plan(self, keys: Mapping[str, str], priority: str | None) -> Plan:
        if not isinstance(keys, Mapping):
            raise InvalidRequest("must map level names to keys", "keys")
        signature = (tuple(map(keys.get, self._level_names)), priority)
        plan = self._plans.get(signature)
        if plan is None:
            plan = self._build_plan(keys, self._priority(priority))
            if len(self._plans) >= PLAN_CACHE_SIZE:
                self._forget_oldest_plan()
            self._plans[signature] = plan
        return plan

    def _forget_oldest_plan(self) -> None:
        try:
            del self._plans[next(iter(self._plans))]
        except (KeyError, RuntimeError, StopIteration):
            pass  # another thread changed the cache first; it will be trimmed next time

    def _priority(self, name: str | None) -> PriorityClass | None:
        if name is None:
            return None
        if name not in self.priorities:
            known = ", ".join(sorted(self.priorities)) or "none"
            raise InvalidRequest(f"unknown priority {name!r} (known: {known})", "priority")
        return self.priorities[name]

    def _build_plan(self, keys: Mapping[str, str], priority: PriorityClass | None) -> Plan:
        stateful, stateless = [], []
        for level, rules in self.levels.items():
            key = keys.get(level)
            if key is None:
                continue
            if not isinstance(key, str) or not key:
                raise InvalidRequest("must be a non-empty string", f"keys.{level}")
            for rule in rules:
                floor = priority.floor(level, rule) if priority else 0.0
                (stateful if rule.stateful else stateless).append(Check(level, key, rule, floor))
        return self._assemble(stateful, stateless)

    def _assemble(self, stateful: list[Check], stateless: list[Check]) -> Plan:
        plan = Plan()
        plan.checks = stateful
        plan.names = [f"{c.level}: {c.rule.display()}" for c in stateful]
        plan.reasons = [c.rule.label or RATE_LIMITED for c in stateful]
        plan.stateless = [(c, f"{c.level}: {c.rule.display()}", c.rule) for c in stateless]
        plan.leased = any(c.rule.leased for c in stateful)
        limits = [(c.rule.max_cost(c.floor), i) for i, c in enumerate(stateful + stateless)
                  if not c.rule.shadow]
        plan.max_cost, plan.too_big = min(limits, default=(INFINITY, -1))
        plan.store_plan = self.store.prepare(stateful)
        return plan

    def _too_big(self, plan: Plan) -> Decision:
        names = plan.names + [name for _, name, _ in plan.stateless]
        return Decision(False, INFINITY, names[plan.too_big], COST_EXCEEDS_LIMIT, 0.0)

    def _check_stateless(self, plan: Plan, cost: float, now: float) -> Decision | None:
        """Stateless rules decide before the store is asked. On a denial the stateful rules'
        waits still count towards `retry_after`, so the store is asked without taking."""
        for check, _, rule in plan.stateless:
            if not rule.shadow and rule.wait_for_key(check.key, now, cost) > 0:
                return self._explain(plan, cost, now)[0]
        return None


def _row(check: Check, wait: float = 0.0, remaining: float = INFINITY) -> dict:
    rule = check.rule
    return {"level": check.level, "key": check.key, "rule": rule.display(),
            "name": f"{check.level}: {rule.display()}", "label": rule.label,
            "shadow": rule.shadow, "floor": check.floor, "wait": wait, "remaining": remaining}


def _decision_from_rows(rows: list[dict]) -> Decision:
    enforced = [row for row in rows if not row["shadow"]]
    worst = max(enforced, key=lambda row: row["wait"], default=None)
    shadows = tuple(row["name"] for row in rows if row["shadow"] and row["wait"] > 0)
    remaining = min((row["remaining"] for row in enforced), default=INFINITY)
    if worst is None or worst["wait"] <= 0:
        return Decision(True, 0.0, None, OK, remaining, shadow_blocked=shadows)
    reason = worst["label"] or RATE_LIMITED
    return Decision(False, worst["wait"], worst["name"], reason, remaining, shadow_blocked=shadows)


def _refuse_cost(cost: Any) -> None:
    if isinstance(cost, bool) or not isinstance(cost, (int, float)):
        raise InvalidRequest(f"must be a number, not {type(cost).__name__}", "cost")
    raise InvalidRequest(f"must be greater than 0 and at most {LARGEST_NUMBER:.0e}, got {cost!r}", "cost")
