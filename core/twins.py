"""A rule's Redis twin: declared beside the rule, read by the Redis store.

A rule with a twin runs on Redis as part of the store's Lua library, which is assembled from
the Lua files of every registered rule's twin (stores/library.py). The twin's file does the
rule's arithmetic on the same doubles as its Python, and registers its functions as
`RULES['<the file's stem>']` (see stores/lua/decide.lua for the functions it may define).
The twin also says what the store hands those functions (`args`: the rule's attributes, as
numbers, after the state, time, cost and floor), and how the rule's state is kept in Redis
when Python writes or reads it (the optimistic path beside a plug-in with no twin; explain
and inspect): as a string, a list or a sorted set, encoded and decoded by the twin.

A subclass does not inherit its parent's twin (see Rule.__init_subclass__): its behaviour may
differ, and it would run its parent's Lua. A rule with no twin is decided on Redis by the
optimistic path (WATCH, the two phases in Python, MULTI/EXEC), its state stored as JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# How a state may be kept, and what `decode` then gets: a string's bytes; a list's items (bytes,
# in order); a sorted set's (member bytes, score) pairs, lowest score first.
REDIS_TYPES = ("string", "list", "zset")
# Where the built-in rules' Lua lives.
LUA_DIR = Path(__file__).parent / "stores" / "lua"


@dataclass(frozen=True)
class RedisTwin:
    """How a rule runs on Redis: its Lua file, the attributes handed to it, and its state as
    Redis keeps it. `encode(rule, state)` gives what is stored: a string or integer for a
    string, a list of strings for a list, {member: score} for a sorted set; an empty list or
    dict stores nothing. `decode(rule, raw)` gives the state back in the rule's own shape (the
    first two fields, idle_at and remaining, may be 0: nothing reads them from Redis); it is
    never handed a missing key. `shareable`: a cluster may decide the rule against this
    process's share of a global budget (stores/shares.py), which only token buckets can be.
    `per_call(rule, now)`: numbers that depend on the time of the call (a quota's period, which
    needs zoneinfo, which a script has not), handed after `args` at every call; `now` is None
    where the store keeps the time (Redis TIME). Only plans with such a twin pay for it."""

    lua: Path
    args: tuple[str, ...]
    encode: Callable[[Any, Any], Any]
    decode: Callable[[Any, Any], Any]
    redis_type: str = "string"
    shareable: bool = False
    per_call: Callable[[Any, float | None], tuple[float, ...]] | None = None

    def __post_init__(self) -> None:
        if self.redis_type not in REDIS_TYPES:
            raise ValueError(f"RedisTwin {self.lua.name}: redis_type must be one of {', '.join(REDIS_TYPES)}")
        if not self.args:
            raise ValueError(f"RedisTwin {self.lua.name}: a twin is handed at least one of its rule's attributes")

    @property
    def name(self) -> str:
        """The name its Lua registers under, and the plans' scripts call it by: the file's stem."""
        return self.lua.stem

    def arguments(self, rule: Any) -> str:
        """What the script gets for `rule`: its `args`, as doubles, joined by commas."""
        return ",".join(repr(float(getattr(rule, name))) for name in self.args)

    @staticmethod
    def format_per_call(numbers: tuple[float, ...]) -> str:
        """What a call's `per_call` numbers add to the rule's arguments: each after a comma."""
        return "".join(f",{float(number)!r}" for number in numbers)
