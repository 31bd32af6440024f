"""The hierarchical limiter: rules at several levels, one atomic check-then-take per decision.

    limiter = HierarchicalLimiter.from_config(config, store=store_from_url("memory://"))
    d = limiter.acquire({"user": "u1", "team": "acme", "global": "*"}, cost=1)

Phase 1 asks every rule at every level named in `keys` how long until `cost` fits; phase 2
takes from every rule only if every answer was 0. A denial consumes nothing anywhere. The
store does both phases in one atomic step, so this holds across threads and processes.

`reserve` is `acquire` for an estimated cost, with a record in the store that `settle` turns
into the real cost later (see core/reservations.py); `acquire_batch` decides many requests,
perhaps for several limiters on one store, in one round trip.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, NamedTuple

from .config import FailMode, PriorityClass, check_demotions, parse_fail_modes, parse_levels, parse_priorities
from .credits import clean_amount, credits_rule
from .decision import (
    COST_EXCEEDS_LIMIT,
    INFINITY,
    NO_NAMES,
    RATE_LIMITED,
    Decision,
    Finding,
    allowed,
    degraded_allowed,
    degraded_denied,
    denied,
)
from .errors import InvalidRequest, ReservationNotFound, ReservationSettled, StoreUnavailable
from .params import LARGEST_NUMBER
from .reservations import (
    CANCELLED,
    COMMITTED,
    LONGEST_HOLD,
    OPEN,
    Reservation,
    Settlement,
    clean_actual_cost,
    clean_hold,
    clean_reservation_id,
)
from .rules import EPSILON, Rule
from .stores import Check, MemoryStore, Store
from .stores.base import AsyncDecider
from .unanswered import Unanswered

# About 2 KB a plan, so at most ~40 MB; a key set beyond that costs a rebuild (~20 us).
PLAN_CACHE_SIZE = 20_000
_NUMBER_TYPES = (int, float)
# What a closed level tells callers to wait while the store is down: about how long the
# circuit breaker waits before it tries the store again.
STORE_RETRY_AFTER = 1.0

_making_unanswered = threading.Lock()

# A concurrency slot's lease id: this process's prefix and a counter.
_lease_prefix: str
_lease_numbers: itertools.count[int]


def _draw_lease_ids() -> None:
    """A new prefix and counter: at import, and in a forked child, so that workers forked
    from one parent (gunicorn --preload) never hand out the same lease id."""
    global _lease_prefix, _lease_numbers
    _lease_prefix = os.urandom(6).hex()
    _lease_numbers = itertools.count(1)


_draw_lease_ids()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_draw_lease_ids)


@dataclass(slots=True, eq=False)
class Plan:
    """A key set and priority, resolved once: the store's plan, the call that decides on it,
    and what names the results. Built by `Plan.of`, and only there."""

    store_plan: Any  # what the store's prepare() made of the stateful checks
    decide: Callable[[float, float, str | None], Decision | Finding]  # the store's decider(store_plan)
    checks: list[Check]  # the stateful checks, in level order
    names: list[str]  # each check's "level: rule", for blocked_by
    reasons: list[str]  # each check's label, or RATE_LIMITED
    stateless: list[tuple[Check, str, Rule]]  # the stateless checks, with their names
    max_cost: float  # the largest cost that can ever fit
    too_big: int  # the index (stateful, then stateless) of the rule that sets max_cost
    leased: bool  # whether a check holds a concurrency slot per request
    lean_max_cost: float  # the largest cost acquire() decides on its lean path; -inf: none
    longest_hold: float  # how long a reservation may hold: at most the shortest lease
    named: int  # how many levels the key set named (with a key that is not None)
    demotions: list[tuple[int, str]]  # soft checks with a demote_to: (index, priority class)
    adecide: AsyncDecider | None = None  # the store's adecider(store_plan), made on first use

    @classmethod
    def of(
        cls, store: Store, stateful: list[tuple[Check, str]], stateless: list[tuple[Check, str]], named: int
    ) -> Plan:
        """The plan of these checks, each with its name ("level: rule"), in level order."""
        checks = [check for check, _ in stateful]
        leased = any(check.rule.leased for check in checks)
        limits = [
            (check.rule.max_cost(check.floor), i)
            for i, (check, _) in enumerate(stateful + stateless)
            if not check.rule.shadow
        ]
        max_cost, too_big = min(limits, default=(INFINITY, -1))
        # The lean path in acquire() serves plans with nothing but stateful, unleased rules,
        # and no soft quota that demotes (a request must be read before it is decided).
        demotions = [(i, check.rule.demote_to) for i, check in enumerate(checks) if check.rule.demote_to]
        lean = not (leased or stateless or demotions)
        store_plan = store.prepare(checks)
        return cls(
            store_plan=store_plan,
            decide=store.decider(store_plan),
            checks=checks,
            names=[name for _, name in stateful],
            reasons=[check.rule.label or RATE_LIMITED for check, _ in stateful],
            stateless=[(check, name, check.rule) for check, name in stateless],
            max_cost=max_cost,
            too_big=too_big,
            leased=leased,
            lean_max_cost=min(max_cost, LARGEST_NUMBER) if lean else -INFINITY,
            # A reservation must not outlive its concurrency slot: it holds for at most the
            # shortest lease of the plan.
            longest_hold=min(
                (float(getattr(check.rule, "lease", LONGEST_HOLD)) for check in checks if check.rule.leased),
                default=LONGEST_HOLD,
            ),
            named=named,
            demotions=demotions,
        )


class Request(NamedTuple):
    """One request, checked and planned up to asking the store: what acquire, reserve and a
    batch share. `denied`: a stateless rule denies it, so the store is asked only for the
    other rules' waits (without taking), in its turn."""

    limiter: HierarchicalLimiter
    plan: Plan
    keys: Mapping[str, str]
    cost: float
    priority: str | None
    now: float
    lease: str | None
    shadowed: tuple[str, ...]  # the stateless shadow rules that would deny
    denied: bool


class HierarchicalLimiter:
    """Rules per level, state in a store, decisions that take from all levels or none."""

    def __init__(
        self,
        levels: Mapping[str, list[Rule]],
        store: Store | None = None,
        clock: Callable[[], float] | None = None,
        priorities: Mapping[str, PriorityClass] | None = None,
        fail_modes: Mapping[str, FailMode] | None = None,
    ) -> None:
        if clock is None:
            # The store's own clock (monotonic in process, Redis TIME) is no calendar: rules
            # that read one (quotas) read this process's wall clock instead.
            levels = {level: [rule.on_wall_clock(time.time) for rule in rules] for level, rules in levels.items()}
        self.levels = dict(levels)
        self.fail_modes = {level: FailMode() for level in self.levels} | dict(fail_modes or {})
        self._injected_clock = clock
        self._fallback: HierarchicalLimiter | None = None
        self._slotless: HierarchicalLimiter | None = None
        self.store = store if store is not None else MemoryStore()
        self.clock = clock if clock is not None else self.store.clock
        self.priorities = dict(priorities or {})
        self._level_names = tuple(self.levels)
        self._level_count = len(self._level_names)
        self._known = ", ".join(self._level_names) or "none"
        # The plan cache's key: the key of every level, in level order. A request that
        # leaves a level out misses here (KeyError) and is found by _plan() instead.
        self._signature: Callable[[Mapping[str, str]], Any] = itemgetter(*self._level_names) if self.levels else tuple
        # What blocked_by shows for each rule, worked out once rather than per plan.
        self._named_rules = {
            level: [(rule, f"{level}: {rule.display()}") for rule in rules] for level, rules in self.levels.items()
        }
        self._rules_by_name = {name: rule for named in self._named_rules.values() for rule, name in named}
        self._plans: dict[str | None, dict[Any, Plan]] = {}  # by priority, then keys
        self._unanswered: Unanswered | None = None
        check_demotions(self.levels, self.priorities)

    @classmethod
    def from_config(
        cls,
        config: Mapping,
        store: Store | None = None,
        clock: Callable[[], float] | None = None,
        priorities: Mapping | None = None,
        fail_modes: Mapping | None = None,
    ) -> HierarchicalLimiter:
        """Build from `{level: [rule specs]}`; bad config raises ConfigError naming the field.
        `fail_modes` maps levels to "open", "closed" or "local" (see config.FailMode)."""
        levels = parse_levels(config)
        names = tuple(levels)
        return cls(levels, store, clock, parse_priorities(priorities, names), parse_fail_modes(fail_modes, names))

    def acquire(self, keys: Mapping[str, str], cost: float = 1, priority: str | None = None) -> Decision:
        """Decide one request: take `cost` at every level named in `keys`, or nothing at all."""
        if cost.__class__ not in _NUMBER_TYPES:
            _refuse_cost(cost)
        plan = self._cached_plan(keys, priority)
        if not 0 < cost <= plan.lean_max_cost:  # also false for NaN
            return self._acquire_slowly(plan, cost, keys, priority)
        try:
            outcome = plan.decide(cost, self.clock(), None)
        except StoreUnavailable:
            return self._degraded(plan, keys, cost, priority)
        # (every way out of the try returns or falls here: no jump over the handler)
        if isinstance(outcome, Decision):
            return outcome  # the store built the plain allowed decision itself
        return self._lean_decision(plan, outcome)

    async def aacquire(self, keys: Mapping[str, str], cost: float = 1, priority: str | None = None) -> Decision:
        """`acquire` for a coroutine: the same plans, checks and decision, with the store's
        call awaited (on Redis, redis-py's asyncio client calling the same Lua function), so
        that the event loop goes on serving while the store answers."""
        if cost.__class__ not in _NUMBER_TYPES:
            _refuse_cost(cost)
        plan = self._cached_plan(keys, priority)
        if not 0 < cost <= plan.lean_max_cost:
            return await self._aacquire_slowly(plan, cost, keys, priority)
        try:
            outcome = await self._adecider(plan)(cost, self.clock(), None)
        except StoreUnavailable:
            return self._degraded(plan, keys, cost, priority)
        if isinstance(outcome, Decision):
            return outcome
        return self._lean_decision(plan, outcome)

    def _cached_plan(self, keys: Mapping[str, str], priority: str | None) -> Plan:
        """The plan of a key set, from the cache when it is there (the hot path), else
        checked and built by _plan()."""
        try:
            plan = self._plans[priority][self._signature(keys)]
        except (KeyError, AttributeError, TypeError):
            return self._plan(keys, priority)
        # Every level has a key here, so a key set of another size names a level that
        # does not exist: _plan() refuses it. A cached plan was checked when built.
        return plan if len(keys) == self._level_count else self._plan(keys, priority)

    @staticmethod
    def _lean_decision(plan: Plan, outcome: Finding) -> Decision:
        """The decision of what the store found on the lean path (no lease, no stateless rule)."""
        blocker, wait, remaining, shadows, over = outcome
        if shadows or (blocker < 0 and over):  # `over`: soft quotas it took past their limit
            return HierarchicalLimiter._outcome(plan, blocker, wait, remaining, shadows, over, None)
        if blocker < 0:
            return allowed(remaining)
        return denied(wait, plan.names[blocker], plan.reasons[blocker], remaining)

    def _adecider(self, plan: Plan) -> AsyncDecider:
        """The plan's decision for coroutines, made on first use: sync callers never pay for it."""
        adecide = plan.adecide
        if adecide is None:
            adecide = plan.adecide = self.store.adecider(plan.store_plan)
        return adecide

    def without_slots(self) -> HierarchicalLimiter:
        """This limiter with its concurrency rules left out, on the same store: a request it
        decides takes no slot and meets no concurrency limit, while every other rule counts it
        in its usual state (a store keys a rule's state by level, key and rule, never by the
        rule's place). For callers that could not give a slot back, such as a forward-auth
        gateway in front of an upstream that never releases. Itself when it has no such rule."""
        if self._slotless is None:
            if not any(rule.leased for rules in self.levels.values() for rule in rules):
                self._slotless = self
            else:
                levels = {level: [rule for rule in rules if not rule.leased] for level, rules in self.levels.items()}
                self._slotless = HierarchicalLimiter(
                    levels, self.store, self._injected_clock, self.priorities, self.fail_modes
                )
        return self._slotless

    def _acquire_slowly(self, plan: Plan, cost: float, keys: Mapping[str, str], priority: str | None) -> Decision:
        """Every case the lean path leaves out: a bad cost, a cost that never fits,
        stateless rules, and concurrency leases."""
        _check_cost(cost)
        request = self._request(plan, keys, cost, priority, self.clock)
        if type(request) is Decision:
            return request
        if request.denied:
            return self._explain(request.plan, cost, request.now)[0]
        try:
            outcome: Decision | Finding | StoreUnavailable = request.plan.decide(cost, request.now, request.lease)
        except StoreUnavailable as error:
            outcome = error
        return self._decision(request, outcome)

    async def _aacquire_slowly(
        self, plan: Plan, cost: float, keys: Mapping[str, str], priority: str | None
    ) -> Decision:
        """_acquire_slowly for aacquire: the steps that read the store (a soft quota's
        demotion, a stateless denial's waits) run through the store's call_async."""
        _check_cost(cost)
        store = self.store
        if plan.demotions and cost <= plan.max_cost:
            request = await store.call_async(self._request, plan, keys, cost, priority, self.clock)
        else:
            request = self._request(plan, keys, cost, priority, self.clock)
        if type(request) is Decision:
            return request
        if request.denied:
            return (await store.call_async(self._explain, request.plan, cost, request.now))[0]
        try:
            outcome: Decision | Finding | StoreUnavailable = await self._adecider(request.plan)(
                cost, request.now, request.lease
            )
        except StoreUnavailable as error:
            outcome = error
        return self._decision(request, outcome)

    def _request(
        self, plan: Plan, keys: Mapping[str, str], cost: float, priority: str | None, when: Callable[[], Any]
    ) -> Request | Decision:
        """The pipeline up to the store, once for acquire, reserve and batches: a cost that
        can never fit is denied at once; then the time (`when`), the plan of the priority
        class a soft quota demotes it to, the stateless rules, and a lease id when the plan
        holds a concurrency slot."""
        if cost > plan.max_cost:
            return self._too_big(plan)
        now = when()
        if plan.demotions:
            plan = self._demoted(plan, keys, cost, now)
            if cost > plan.max_cost:
                return self._too_big(plan)
        denied, shadowed = self._stateless_verdict(plan, cost, now) if plan.stateless else (False, NO_NAMES)
        lease = f"{_lease_prefix}-{next(_lease_numbers):x}" if plan.leased and not denied else None
        return Request(self, plan, keys, cost, priority, now, lease, shadowed, denied)

    def _decision(self, request: Request, outcome: Decision | Finding | StoreUnavailable) -> Decision:
        """The decision from what the store found (with the stateless shadow rules' names), or
        from the fail modes when it could not be reached."""
        if isinstance(outcome, StoreUnavailable):
            return self._degraded(request.plan, request.keys, request.cost, request.priority)
        if isinstance(outcome, Decision):
            decision = outcome
        else:
            blocker, wait, remaining, shadows, over = outcome
            decision = self._outcome(request.plan, blocker, wait, remaining, shadows, over, request.lease)
        shadowed = request.shadowed
        return decision._replace(shadow_blocked=decision.shadow_blocked + shadowed) if shadowed else decision

    @staticmethod
    def _outcome(
        plan: Plan,
        blocker: int,
        wait: float,
        remaining: float,
        shadows: tuple[int, ...],
        over: tuple[int, ...],
        lease: str | None,
    ) -> Decision:
        names = plan.names
        shadow_blocked = tuple([names[i] for i in shadows]) if shadows else NO_NAMES
        if blocker < 0:
            return allowed(remaining, lease, shadow_blocked, tuple([names[i] for i in over]) if over else NO_NAMES)
        return denied(wait, names[blocker], plan.reasons[blocker], remaining, shadow_blocked)

    def explain(
        self, keys: Mapping[str, str], cost: float = 1, priority: str | None = None
    ) -> tuple[Decision, list[dict]]:
        """A dry run: the decision `acquire` would make now, and every rule's wait and
        remaining (before any take), consuming nothing."""
        _check_cost(cost)
        plan, now = self._plan(keys, priority), self.clock()
        if plan.demotions and cost <= plan.max_cost:
            plan = self._demoted(plan, keys, cost, now)
        return self._explain(plan, cost, now)

    def _explain(self, plan: Plan, cost: float, now: float) -> tuple[Decision, list[dict]]:
        found = self.store.explain(plan.store_plan, cost, now)
        rows = [_row(check, wait, left) for check, (wait, left) in zip(plan.checks, found)]
        rows += [_row(check, rule.wait_for_key(check.key, _wall(now), cost)) for check, _, rule in plan.stateless]
        if cost > plan.max_cost:
            return self._too_big(plan), rows
        soft = {
            plan.names[i]: 1.0 if check.rule.counts_requests else cost
            for i, check in enumerate(plan.checks)
            if check.rule.soft
        }
        return _decision_from_rows(rows, soft), rows

    def _demoted(self, plan: Plan, keys: Mapping[str, str], cost: float, now: float) -> Plan:
        """The plan to decide on: that of the priority class a soft quota demotes to when
        this request would take it past its limit (the first such quota, in level order);
        else `plan`. One more read of the store, before the decision: a request decided at
        the same time may move the quota in between (docs/ENGINE.md, Quotas: demote_to)."""
        try:
            readings = self.store.explain(plan.store_plan, cost, now)
        except StoreUnavailable:
            return plan  # the decision meets the outage in its turn, and its fail modes
        for index, demote_to in plan.demotions:
            amount = 1.0 if plan.checks[index].rule.counts_requests else cost
            if readings[index][1] < amount - EPSILON:
                return self._plan(keys, demote_to)
        return plan

    def inspect(self, level: str, key: str) -> list[dict]:
        """The live state of every stateful rule that applies to `key` at `level`, each row
        with its rule's `position` among the level's rules as configured: what names a row
        where rules look alike, or a stateless rule has no row."""
        plan = self._one_level(level, key)
        states = self.store.inspect(plan.store_plan, self.clock())
        positions = {id(rule): i for i, rule in enumerate(self.levels[level])}
        return [
            {**_row(check), "position": positions[id(check.rule)], "state": state}
            for check, state in zip(plan.checks, states)
        ]

    def release(self, keys: Mapping[str, str], lease: str) -> int:
        """Hand back the concurrency slots that `lease` holds; returns how many rules gave one."""
        plan = self._plan(keys, None)
        if not plan.leased:
            return 0
        try:
            return self.store.release(plan.store_plan, self.clock(), lease)
        except StoreUnavailable:
            return 0  # the slot comes back by itself when its lease runs out

    async def arelease(self, keys: Mapping[str, str], lease: str) -> int:
        """`release` for a coroutine, through the store's call_async."""
        plan = self._plan(keys, None)
        if not plan.leased:
            return 0
        try:
            return await self.store.call_async(self.store.release, plan.store_plan, self.clock(), lease)
        except StoreUnavailable:
            return 0

    def reserve(
        self, keys: Mapping[str, str], cost: float = 1, priority: str | None = None, hold: float | None = None
    ) -> tuple[Decision, Reservation | None]:
        """`acquire`, and when it takes, a Reservation to settle later with the real cost.
        The store keeps it open for `hold` seconds (60 by default, at most the shortest
        concurrency lease). A denial, or a degraded decision (the store is down, so no
        record can be kept: skip settling), comes with None."""
        _check_cost(cost)
        plan = self._plan(keys, priority)
        hold = clean_hold(hold, plan.longest_hold)
        try:
            request = self._request(plan, keys, cost, priority, self._record_time)
        except StoreUnavailable:
            return self._degraded(plan, keys, cost, priority), None
        if type(request) is Decision:
            return request, None
        plan = request.plan  # a soft quota's demotion may have chosen another
        if request.denied:
            return self._explain(plan, cost, request.now)[0], None
        now, lease = request.now, request.lease
        levels = {level: keys[level] for level in self._level_names if keys.get(level) is not None}
        reservation = Reservation(
            self.store.new_reservation_id(plan.store_plan), levels, cost, priority, now, now + hold, lease, hold
        )
        try:
            outcome: Decision | Finding | StoreUnavailable = self.store.reserve(
                plan.store_plan, cost, now, lease, reservation.to_dict()
            )
        except StoreUnavailable as error:
            outcome = error
            # The store may have made it all the same (its answer came too late): cancel it
            # once the store answers again, else its estimate would stay spent.
            if error.sent:
                self.unanswered.add(reservation.id, hold)
        decision = self._decision(request, outcome)
        return decision, reservation if decision.allowed and not decision.degraded else None

    @property
    def unanswered(self) -> Unanswered:
        """The reservations whose store call failed, cancelled once the store answers again
        (core/unanswered.py); made on first use."""
        if self._unanswered is None:
            with _making_unanswered:  # two threads at once must not make two
                if self._unanswered is None:
                    self._unanswered = Unanswered(lambda reservation_id: self.settle(reservation_id, None))
        return self._unanswered

    def _record_time(self) -> float:
        """A time a record can carry: on Redis, with no clock injected, the server's (one
        more round trip)."""
        now = self.clock()
        return self.store.time() if now is None else now

    def settle(self, reservation_id: str, actual_cost: float | None = None) -> Settlement:
        """Settle a reservation with what the work really cost: the difference is given back
        or charged (into debt if need be) at every rule that counts cost, and its concurrency
        slots are released. `actual_cost=None` cancels: everything comes back. Raises
        ReservationNotFound, ReservationSettled, or StoreUnavailable (the lease then runs
        out by itself)."""
        reservation_id = clean_reservation_id(reservation_id)
        actual_cost = clean_actual_cost(actual_cost)
        now = self.clock()
        record = self.store.reservation(reservation_id, now)
        if record is None:
            raise ReservationNotFound(f"no reservation {reservation_id!r} (unknown or expired)")
        if record["status"] != OPEN:
            raise ReservationSettled(f"reservation {reservation_id!r} is already {record['status']}")
        # No priority: floors do not matter to a settlement, and the class may be gone since.
        # A level gone from the limiter since has nothing left to give back or charge.
        keys = {level: key for level, key in record["keys"].items() if level in self.levels}
        plan = self._plan(keys, None) if keys else Plan.of(self.store, [], [], 0)
        delta, released = self.store.settle(plan.store_plan, reservation_id, actual_cost, now)
        return Settlement(
            reservation_id,
            CANCELLED if actual_cost is None else COMMITTED,
            float(max(0.0, -delta)),
            float(max(0.0, delta)),
            released,
        )

    def reset(self, level: str, key: str) -> None:
        """Forget every rule's state for `key` at `level`: its buckets start full."""
        self.store.reset(self._one_level(level, key).store_plan)

    def top_up(self, level: str, key: str, rule: str | int, amount: float) -> float:
        """Add `amount` to the credits of `key` at `level` held by `rule` (its label, or its
        index among the level's rules), which must be a quota with `period: none`; atomic on
        every store. Returns the balance after (below zero if it was overspent by more).
        Refused with InvalidRequest naming `level`, `key`, `rule` or `amount`."""
        if not isinstance(level, str) or level not in self.levels:
            raise InvalidRequest(f"unknown level {level!r} (known: {self._known})", "level")
        if not isinstance(key, str) or not key:
            raise InvalidRequest("must be a non-empty string", "key")
        target = credits_rule(self.levels[level], rule)
        amount = clean_amount(amount)
        plan = self.store.prepare([Check(level, key, target, 0.0)])
        return self.store.adjust(plan, self.clock(), -amount)[0]

    def rule_named(self, name: str | None) -> Rule | None:
        """The rule that a decision's `blocked_by` names, or None."""
        return self._rules_by_name.get(name) if name is not None else None

    def _one_level(self, level: str, key: str) -> Plan:
        """The plan of one key at one level, for inspect and reset."""
        if not isinstance(level, str) or level not in self.levels:
            raise InvalidRequest(f"unknown level {level!r} (known: {self._known})", "level")
        return self._plan({level: key}, None)

    def _plan(self, keys: Mapping[str, str], priority: str | None) -> Plan:
        """The plan for a key set and priority: from the cache, or built and cached. A key
        set that names a level this limiter does not have, or none of its levels, is
        refused: either would leave the request unlimited."""
        if not isinstance(keys, Mapping):
            raise InvalidRequest("must map level names to keys", "keys")
        values = tuple(map(keys.get, self._level_names))
        signature = values[0] if len(values) == 1 else values  # what itemgetter gives
        try:
            plan = self._plans[priority][signature]
        except (KeyError, TypeError):
            pass  # not cached yet, or a key or priority that is no name at all
        else:
            # The same keys at the known levels: only a level it does not know, or one
            # given as None, can make the key set longer than what the plan was built from.
            if len(keys) != plan.named:
                self._check_levels(keys)
            return plan
        self._check_levels(keys)
        plan = self._build_plan(keys, self._priority(priority))
        plans = self._plans.setdefault(priority, {})
        if len(plans) >= PLAN_CACHE_SIZE:
            # Dropping the whole cache costs one rebuild per live key set, once; dropping
            # the oldest entry one at a time gets slower as the dict fills with holes.
            plans.clear()
        plans[signature] = plan
        return plan

    def _priority(self, name: str | None) -> PriorityClass | None:
        if name is None:
            return None
        if not isinstance(name, str) or name not in self.priorities:
            known = ", ".join(sorted(self.priorities)) or "none"
            raise InvalidRequest(f"unknown priority {name!r} (known: {known})", "priority")
        return self.priorities[name]

    def _check_levels(self, keys: Mapping[str, str]) -> None:
        """InvalidRequest unless every level of `keys` is one of this limiter's and at least
        one of them has a key (None stands for a level left out)."""
        for level in keys:
            if level not in self.levels:
                raise InvalidRequest(f"unknown level {level!r} (known: {self._known})", f"keys.{level}")
        if all(keys.get(level) is None for level in self._level_names):
            raise InvalidRequest(f"must name at least one level (known: {self._known})", "keys")

    def _build_plan(self, keys: Mapping[str, str], priority: PriorityClass | None) -> Plan:
        stateful: list[tuple[Check, str]] = []
        stateless: list[tuple[Check, str]] = []
        named = 0
        for level, rules in self._named_rules.items():
            key = keys.get(level)
            if key is None:
                continue
            if not isinstance(key, str) or not key:
                raise InvalidRequest("must be a non-empty string", f"keys.{level}")
            named += 1
            for rule, name in rules:
                floor = priority.floor(level, rule) if priority else 0.0
                (stateful if rule.stateful else stateless).append((Check(level, key, rule, floor), name))
        return Plan.of(self.store, stateful, stateless, named)

    def _degraded(self, plan: Plan, keys: Mapping[str, str], cost: float, priority: str | None) -> Decision:
        """The store is unreachable: each level of the plan applies its fail mode. A closed
        level denies; local levels decide in process at their fallback fraction; open levels
        allow. The decision says `degraded`."""
        levels = [level for level in self.levels if any(c.level == level for c in plan.checks)]
        for level in levels:
            if self.fail_modes[level].mode == "closed":
                return degraded_denied(STORE_RETRY_AFTER, f"{level}: store unavailable")
        local = {level: keys[level] for level in levels if self.fail_modes[level].mode == "local"}
        if local:
            return self._local_fallback().acquire(local, cost, priority)._replace(degraded=True)
        return degraded_allowed()

    def _local_fallback(self) -> HierarchicalLimiter:
        """An in-process limiter for the local levels, at their fallback fractions."""
        if self._fallback is None:
            levels = {
                level: [rule.scaled(self.fail_modes[level].fallback_fraction) for rule in rules]
                for level, rules in self.levels.items()
                if self.fail_modes[level].mode == "local"
            }
            self._fallback = HierarchicalLimiter(levels, MemoryStore(), self._injected_clock, self.priorities)
        return self._fallback

    def _too_big(self, plan: Plan) -> Decision:
        names = plan.names + [name for _, name, _ in plan.stateless]
        return denied(INFINITY, names[plan.too_big], COST_EXCEEDS_LIMIT, 0.0)

    @staticmethod
    def _stateless_verdict(plan: Plan, cost: float, now: float) -> tuple[bool, tuple]:
        """Whether a stateless rule denies, and the shadow ones that would."""
        shadows = []
        for check, name, rule in plan.stateless:
            if rule.wait_for_key(check.key, _wall(now), cost) > 0:
                if not rule.shadow:
                    return True, ()
                shadows.append(name)
        return False, tuple(shadows)

    def _batch_entry(self, keys: Mapping[str, str], cost: float, priority: str | None) -> Request | Decision:
        """A batch item, through the pipeline up to the store; nothing taken yet."""
        _check_cost(cost)
        return self._request(self._plan(keys, priority), keys, cost, priority, self.clock)


def acquire_batch(items: Sequence[tuple]) -> list[Decision]:
    """Decide many requests, in order: `[(limiter, keys, cost, priority), ...]` (cost and
    priority may be left out). Each decision is what `limiter.acquire` would give were the
    requests made one after the other; the limiters may differ (tenants) and share a store.
    Every item is validated before anything is taken: a bad item raises InvalidRequest whose
    field starts with its index (`"2.cost"`). On Redis the batch is one round trip."""
    entries = [_validated(i, item) for i, item in enumerate(items)]
    decisions: list = [None] * len(entries)
    waiting: list[int] = []
    for i, entry in enumerate(entries):
        if type(entry) is Decision:
            decisions[i] = entry
        elif entry.denied:  # read alone, in its turn: what came before must be decided first
            _decide_waiting(entries, waiting, decisions)
            waiting = []
            decisions[i] = entry.limiter._explain(entry.plan, entry.cost, entry.now)[0]
        else:
            waiting.append(i)
    _decide_waiting(entries, waiting, decisions)
    return decisions


def _validated(index: int, item: Any) -> Any:
    """The item's batch entry; its InvalidRequest, if any, with the index before the field."""
    try:
        limiter, keys, cost, priority = _unpack(item)
        return limiter._batch_entry(keys, cost, priority)
    except InvalidRequest as error:
        field = f"{index}.{error.field}" if error.field else str(index)
        raise InvalidRequest(error.reason, field) from None


def _unpack(item: Any) -> tuple:
    if not isinstance(item, (tuple, list)) or not 2 <= len(item) <= 4 or not isinstance(item[0], HierarchicalLimiter):
        raise InvalidRequest("must be (limiter, keys, cost, priority)")
    limiter, keys, *rest = item
    return limiter, keys, rest[0] if rest else 1, rest[1] if len(rest) > 1 else None


def _decide_waiting(entries: list, waiting: list[int], decisions: list) -> None:
    """The waiting items, one `decide_many` per store (one round trip on Redis)."""
    by_store: dict[int, list[int]] = {}
    for i in waiting:
        by_store.setdefault(id(entries[i].limiter.store), []).append(i)
    for indexes in by_store.values():
        store = entries[indexes[0]].limiter.store
        outcomes = store.decide_many(
            [(entries[i].plan.store_plan, entries[i].cost, entries[i].now, entries[i].lease) for i in indexes]
        )
        for i, outcome in zip(indexes, outcomes):
            decisions[i] = entries[i].limiter._decision(entries[i], outcome)


def _row(check: Check, wait: float = 0.0, remaining: float = INFINITY) -> dict:
    rule = check.rule
    return {
        "level": check.level,
        "key": check.key,
        "rule": rule.display(),
        "name": f"{check.level}: {rule.display()}",
        "label": rule.label,
        "shadow": rule.shadow,
        "floor": check.floor,
        "wait": wait,
        "remaining": remaining,
    }


def _decision_from_rows(rows: list[dict], soft: Mapping[str, float]) -> Decision:
    """The decision the rows make; `soft`: the soft rules' names, with what the request would
    take from each (they never deny, count in no `remaining`, and are over when it would take
    them past their limit)."""
    enforced = [row for row in rows if not row["shadow"] and row["name"] not in soft]
    worst = max(enforced, key=lambda row: row["wait"], default=None)
    shadows = tuple(row["name"] for row in rows if row["shadow"] and row["wait"] > 0)
    remaining = min((row["remaining"] for row in enforced), default=INFINITY)
    if worst is None or worst["wait"] <= 0:
        over = tuple(
            row["name"] for row in rows if row["name"] in soft and row["remaining"] < soft[row["name"]] - EPSILON
        )
        return allowed(remaining, shadow_blocked=shadows, over_quota=over)
    reason = worst["label"] or RATE_LIMITED
    return denied(worst["wait"], worst["name"], reason, remaining, shadows)


def _wall(now: float | None) -> float:
    """Stateless rules get a time even when the store keeps its own (Redis TIME)."""
    return time.time() if now is None else now


def _check_cost(cost: Any) -> None:
    """InvalidRequest unless `cost` is a number above 0 and at most LARGEST_NUMBER."""
    if cost.__class__ not in _NUMBER_TYPES or not 0 < cost <= LARGEST_NUMBER:
        _refuse_cost(cost)


def _refuse_cost(cost: Any) -> None:
    if isinstance(cost, bool) or not isinstance(cost, (int, float)):
        raise InvalidRequest(f"must be a number, not {type(cost).__name__}", "cost")
    raise InvalidRequest(f"must be greater than 0 and at most {LARGEST_NUMBER:.0e}, got {cost!r}", "cost")
