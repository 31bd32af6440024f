"""The Redis store's Lua: the prelude, the Lua twin of every registered rule, then `decide`,
as one function library (FUNCTION LOAD, called with FCALL) or one script (EVALSHA).

The library is assembled from the rules registered now (core.RULES): a plug-in rule with a
twin (core/twins.py) brings its Lua file, and nothing else changes. Its name and its
function's carry a hash of the Lua they hold, so that deployments (or processes) with
different rules share a Redis without calling each other's code: a server that holds only an
older library answers the new function's FCALL with "Function not found", having run
nothing, and the store loads the new library beside the old one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..rules import RULES
from ..twins import LUA_DIR

PRELUDE = LUA_DIR / "prelude.lua"
DECIDE = LUA_DIR / "decide.lua"


@dataclass(frozen=True)
class LuaLibrary:
    """One assembly of the Lua: the twins it holds (by name), its library and function names,
    and its source both ways."""

    twins: frozenset[str]
    body: str  # the rules' Lua and `decide`
    name: str  # of the library: limiter_admin_<hash>
    function: str  # that `decide` is registered as: limiter_admin_decide_<hash>
    source: str  # the library, for FUNCTION LOAD
    script: str  # the same Lua as one script that decides, for EVALSHA
    sha: str  # of `script`


def registered_twins() -> tuple[tuple[str, Path], ...]:
    """(name, Lua file) of every registered rule's twin, by name."""
    twins: dict[str, Path] = {}
    for rule in RULES.values():
        twin = rule.redis_twin
        if twin is None:
            continue
        if twins.setdefault(twin.name, twin.lua) != twin.lua:
            raise ValueError(f"two Lua twins are named {twin.name!r}: {twins[twin.name]} and {twin.lua}")
    return tuple(sorted(twins.items()))


def current_library() -> LuaLibrary:
    """The library of the rules registered now."""
    return _assemble(registered_twins())


@lru_cache(maxsize=64)
def _assemble(twins: tuple[tuple[str, Path], ...]) -> LuaLibrary:
    body = "\n".join(path.read_text() for path in (PRELUDE, *(lua for _, lua in twins), DECIDE))
    digest = hashlib.sha1(body.encode()).hexdigest()[:16]
    name, function = f"limiter_admin_{digest}", f"limiter_admin_decide_{digest}"
    script = body + "\nreturn decide(KEYS, ARGV)\n"
    return LuaLibrary(
        twins=frozenset(twin for twin, _ in twins),
        body=body,
        name=name,
        function=function,
        source=f"#!lua name={name}\n{body}\nredis.register_function('{function}', decide)\n",
        script=script,
        sha=hashlib.sha1(script.encode()).hexdigest(),
    )


def lua_body() -> str:
    """The registered rules' Lua, then `decide`, the function that uses them."""
    return current_library().body


def lua_source() -> str:
    """The Lua as one script, for EVALSHA: defines everything, then decides."""
    return current_library().script


__all__ = ["LuaLibrary", "current_library", "lua_body", "lua_source", "registered_twins"]
