"""How the Redis store keeps things in Redis when Python reads or writes them: rule states,
as each rule's twin encodes them (its Lua reads and writes the same), reservation records
(hashes), and the tags that tell a key's rule apart."""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Sequence
from typing import Any

from ..base36 import base36
from ..reservations import OPEN
from ..rules import Rule


def redis_type(rule: Rule) -> str:
    """How a rule's state is kept: as its twin says; a rule without one as a JSON string."""
    twin = rule.redis_twin
    return twin.redis_type if twin is not None else "string"


def read_state(pipe: Any, key: str, rule: Rule) -> Any:
    """Queue the read of a rule's state, by the Redis type it is kept as."""
    kind = redis_type(rule)
    if kind == "list":
        return pipe.lrange(key, 0, -1)
    if kind == "zset":
        return pipe.zrange(key, 0, -1, withscores=True)
    return pipe.get(key)


def write_state(pipe: Any, key: str, rule: Rule, state: Any, now: float) -> None:
    """Queue the writes that keep `state` in Redis as its twin encodes it (its Lua reads the
    same), with a TTL until it goes idle plus a second (none for a state that never goes idle,
    a balance of credits); a rule without a twin as JSON."""
    idle = state[0] - now
    ttl = max(1000, math.ceil(idle * 1000) + 1000) if math.isfinite(idle) else None
    twin = rule.redis_twin
    if twin is None:  # its state tuple as JSON, so its fields must be JSON values
        pipe.set(key, json.dumps(list(state)), px=ttl)
        return
    value = twin.encode(rule, state)
    if twin.redis_type == "string":
        pipe.set(key, value, px=ttl)
        return
    pipe.delete(key)
    if value:
        if twin.redis_type == "list":
            pipe.rpush(key, *value)
        else:
            pipe.zadd(key, value)
        if ttl is not None:
            pipe.pexpire(key, ttl)


def decode_state(rule: Rule, raw: Any) -> Any:
    """A rule's state as read from Redis, in the shape its Python code expects; None for none."""
    if raw is None or raw == [] or raw == b"":
        return None
    twin = rule.redis_twin
    return twin.decode(rule, raw) if twin is not None else tuple(json.loads(raw))


# The record's fields that hold JSON; `lease` and `status` are plain text, as Lua reads them.
_RECORD_JSON = ("id", "keys", "cost", "priority", "taken_at", "expires_at", "hold", "actual_cost")


def record_fields(record: dict, untaken: Sequence[str]) -> dict:
    """A reservation's record as the fields of its hash: JSON values, the lease as text
    ('' for none), status open, and an `untaken:<state key>` field per shadow rule that
    would have denied (it took nothing, so settling must not give anything back to it)."""
    fields = {name: json.dumps(value) for name, value in record.items() if name in _RECORD_JSON}
    fields.update({"lease": record["lease"] or "", "status": OPEN})
    fields.update({f"untaken:{key}": "1" for key in untaken})
    return fields


def decode_record(raw: dict) -> dict:
    """A record's hash, as read back, in the shape `reservation()` returns."""
    fields = {name.decode(): value.decode() for name, value in raw.items() if not name.startswith(b"untaken:")}
    record = {name: json.loads(fields[name]) for name in _RECORD_JSON if name in fields}
    record.update({"lease": fields.get("lease") or None, "status": fields.get("status", OPEN)})
    return record


def rule_tag(rule: Rule) -> str:
    """A few characters that tell a key's rule from the other rules of its level and key."""
    return base36(zlib.crc32(rule.rule_id.encode()))
