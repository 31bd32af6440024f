"""The Rule base class and the registry of rule types.

A rule is an algorithm with its parameters. It holds no per-key state: the store keeps
state, and hands it to the rule. That is what lets one rule run in-process or on Redis.

The state protocol. A state is a tuple (or a list, for rules that change it in place)
whose first two fields are `idle_at`, the time from which the state is as good as none
(so a store may forget it), and `remaining`, the room left right after it was written.
The fields after those two are the rule's own. A key never seen, or forgotten, is None.
- `wait(state, now, cost, floor)`: seconds until `cost` fits while `floor` stays in
  reserve; 0.0 when it fits now, math.inf when it never will.
- `take(state, now, cost, lease)`: the new state once `cost` is taken.
- `attempt(state, now, cost, floor)`: both phases' work in one call, for the hot path.
  It returns the wait (a float > 0) when the cost does not fit; otherwise the new state
  to store if every other rule agrees, or DEFER when the rule changes its state in place
  and so may only `take` once all agreed. The default is `wait`, then DEFER.
- `adjust(state, now, delta, taken_at)`: the state once a settled reservation gave back
  (delta < 0) or was charged (delta > 0) the difference from its estimate; `taken_at` is
  when the estimate was taken. None means "as good as no state". The default changes
  nothing, so a plug-in that does not implement it keeps what a reservation took.
A soft rule (`soft`, a quota's `mode: soft`) never denies: it takes past its limit, and the
decision names it in `over_quota` when its room after the take (state[1]) is below zero.
A rule that reads the calendar (a quota) takes `now` as epoch seconds; a limiter whose clock
is not (the in-process store's monotonic default, Redis TIME) hands it one (`on_wall_clock`).
A plug-in implements `wait` and `take` (or, if stateless, `wait_for_key`), and may declare
its Redis twin (`redis_twin`, core/twins.py): one Lua file, beside its class.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from .errors import ConfigError
from .params import Param, clean_params, format_number

if TYPE_CHECKING:
    from .twins import RedisTwin

RULES: dict[str, type[Rule]] = {}

# Returned by `attempt` when the rule takes only after every rule agreed.
DEFER = object()

# Slack for float arithmetic: a refill that lands 1e-12 short of the cost still fits.
EPSILON = 1e-9

# How long a store keeps state that never goes idle by itself (a bucket that never
# refills): long enough to matter, short enough that no key lives forever.
MAX_IDLE_SECONDS = 86400.0


def register(name: str) -> Callable[[type[Rule]], type[Rule]]:
    """Class decorator: make a Rule subclass available to configs as `type: name`."""

    def add(cls: type[Rule]) -> type[Rule]:
        if not issubclass(cls, Rule):
            raise TypeError(f"@register({name!r}) expects a Rule subclass, got {cls!r}")
        cls.type_name = name
        RULES[name] = cls
        return cls

    return add


def rule_class(name: Any, path: str = "") -> type[Rule]:
    """The registered class for `name`, or a ConfigError that lists the known names."""
    cls = RULES.get(name) if isinstance(name, str) else None
    if cls is None:
        known = ", ".join(sorted(RULES))
        raise ConfigError(f"unknown rule type {name!r} (known: {known})", f"{path}.type".lstrip("."))
    return cls


class Rule:
    """Base class of every rule type. Subclasses declare `params` and the state protocol."""

    type_name: ClassVar[str] = "rule"
    params: ClassVar[tuple[Param, ...]] = ()
    # Stateless rules decide from the key alone (`wait_for_key`); the store never sees them.
    stateful: ClassVar[bool] = True
    # Leased rules hold something per request (a concurrency slot) until `release`.
    leased: ClassVar[bool] = False

    # How the rule runs on Redis (core/twins.py); None: decided there optimistically.
    redis_twin: ClassVar[RedisTwin | None] = None

    # The parameters that shrink with a level's fallback fraction when Redis is down.
    scaled_params: ClassVar[tuple[str, ...]] = ()
    # Rules that count requests take 1 per request whatever its cost (a requests-per-minute
    # rule beside a tokens-per-minute one); the others take the request's cost.
    counts_requests: bool = False
    # A soft rule never denies (see the module's docstring); `demote_to` names the priority
    # class a request it sees over its limit is decided under; `credits`: a balance that
    # `HierarchicalLimiter.top_up` adds to.
    soft: bool = False
    demote_to: str | None = None
    credits: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A twin belongs to the class that declares it: a subclass may behave differently,
        # and would run its parent's Lua.
        if "redis_twin" not in cls.__dict__:
            cls.redis_twin = None

    # Why two rules of one level whose rule_id is the same cannot both be: they would be one
    # state (a quota says what names its state).
    one_state = "the same type and parameters are one bucket, whatever the label"

    def __init__(self, label: str | None = None, shadow: bool = False, counts: str = "cost", **params: Any) -> None:
        values = clean_params(self.params, params, "")
        self.values = values
        for name, value in values.items():
            setattr(self, name, value)
        self.label = label
        self.shadow = bool(shadow)
        if counts not in ("cost", "requests"):
            raise ConfigError("must be 'cost' or 'requests'", "counts")
        self.counts_requests = self.counts_requests or counts == "requests"
        self.rule_id = self._rule_id()
        self.setup()

    def setup(self) -> None:
        """Derive whatever the algorithm needs from its parameters (optional)."""

    def scaled(self, fraction: float) -> Rule:
        """The same rule with `scaled_params` multiplied by `fraction` (the local fallback's
        share of the limit); a whole-number parameter keeps at least 1."""
        params = dict(self.values)
        for param in self.params:
            if param.name in self.scaled_params:
                value = params[param.name] * fraction
                params[param.name] = max(1, int(value)) if param.kind == "integer" else value
        counts = "requests" if self.counts_requests and not type(self).counts_requests else "cost"
        return type(self)(label=self.label, shadow=self.shadow, counts=counts, **params)

    # What a priority watermark is a share of: tokens, requests or slots.
    capacity: float = math.inf

    def max_cost(self, floor: float) -> float:
        """The largest cost that can ever fit while `floor` stays in reserve."""
        if self.counts_requests:
            return math.inf if 1 + floor <= self.capacity else -1.0
        return self.capacity - floor

    def wait(self, state: Any, now: float, cost: float, floor: float) -> float:
        raise NotImplementedError(f"{type(self).__name__} must implement wait()")

    def take(self, state: Any, now: float, cost: float, lease: str | None) -> Any:
        if type(self).attempt is Rule.attempt:
            raise NotImplementedError(f"{type(self).__name__} must implement take()")
        return self.attempt(state, now, cost, -math.inf)

    def attempt(self, state: Any, now: float, cost: float, floor: float) -> Any:
        wait = self.wait(state, now, cost, floor)
        return float(wait) if wait > 0.0 else DEFER

    def adjust(self, state: Any, now: float, delta: float, taken_at: float) -> Any:
        """The state once a reservation taken at `taken_at` is settled: `-delta` given back
        (never above capacity) or `delta` charged, even into debt (the work is done). The
        default keeps the state as it is: an estimate that is never refunded."""
        return state

    def wait_for_key(self, key: str, now: float, cost: float) -> float:
        """For stateless rules: the wait, from the key alone."""
        raise NotImplementedError(f"{type(self).__name__} must implement wait_for_key()")

    def remaining(self, state: Any, now: float) -> float:
        """How much cost would fit now (no floor). Defaults to the capacity."""
        return self.capacity

    def balance(self, state: Any, now: float) -> float:
        """What is left, as it is: below zero for a rule in debt. Defaults to `remaining`."""
        return self.remaining(state, now)

    def on_wall_clock(self, clock: Callable[[], float]) -> Rule:
        """This rule for a limiter whose clock does not tell epoch seconds: a rule that reads
        the calendar reads `clock` for it. The default, a rule that does not, is itself."""
        return self

    def release(self, state: Any, now: float, lease: str) -> Any:
        """The state once `lease` gave back what it holds; None when it held nothing."""
        return None

    def shorten_lease(self, state: Any, lease: str, until: float) -> Any:
        """The state once what `lease` holds runs out no later than `until`: a reservation's
        slot lasts as long as the reservation. The default changes nothing."""
        return state

    def inspect(self, state: Any, now: float) -> dict:
        """The live state of one key, for operators."""
        return {"remaining": self.remaining(state, now)}

    def describe(self) -> str:
        """The name used in `blocked_by`, like `token_bucket(100, 10/s)`."""
        args = ", ".join(_show(v) for v in self.values.values())
        return f"{self.type_name}({args})"

    def display(self) -> str:
        """`describe()` plus how it counts, when that is not the default."""
        return self.describe() + (" per request" if self.counts_requests else "")

    def _rule_id(self) -> str:
        # Identifies the rule's state in a store: same type and parameters, same state,
        # so two tiers that share a global rule share its bucket.
        parts = [self.type_name, *(_show(v) for v in self.values.values())]
        return ":".join(parts + ["requests"] if self.counts_requests else parts)

    def __repr__(self) -> str:
        return f"<{self.describe()}>"


def _show(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return "[" + ",".join(value) + "]"
    return format_number(value) if isinstance(value, (int, float)) else str(value)


def build_rule(spec: Any, path: str) -> Rule:
    """Turn one rule spec (`{"type": ..., params..., "label": ..., "shadow": ...}`) into a Rule."""
    if not isinstance(spec, dict):
        raise ConfigError(f"a rule must be a mapping, not {type(spec).__name__}", path)
    cls = rule_class(spec.get("type"), path)
    params = {k: v for k, v in spec.items() if k not in ("type", "label", "shadow", "counts")}
    label = spec.get("label")
    if label is not None and (not isinstance(label, str) or not label.strip()):
        raise ConfigError("must be a non-empty string", f"{path}.label")
    if label is not None and not label.isascii() and not _is_text(label):
        # A JSON "\ud800" escape: a denial's reason must be writable as UTF-8.
        raise ConfigError("must not hold surrogate characters (U+D800 to U+DFFF)", f"{path}.label")
    if label is not None and "\x00" in label:
        # PostgreSQL's text refuses it, and no header or log line can carry it.
        raise ConfigError("must not hold a NUL character", f"{path}.label")
    shadow = spec.get("shadow", False)
    if not isinstance(shadow, bool):
        raise ConfigError("must be true or false", f"{path}.shadow")
    try:
        return cls(label=label, shadow=shadow, counts=spec.get("counts", "cost"), **params)
    except ConfigError as error:
        field = f"{path}.{error.path}" if error.path else path
        raise ConfigError(f"{error.reason} ({cls.type_name})", field) from None


def _is_text(value: str) -> bool:
    """Whether `value` can be written as UTF-8 (it holds no lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
