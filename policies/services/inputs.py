"""Reading what callers ask: a decision request (the body of /decisions, each item of
/decisions/batch, a reservation, a settlement), and the keys, costs and priorities that every
transport reads the same way.

Written out by hand rather than as DRF serializers: a batch holds up to 1,000 of these, and
a serializer costs tens of microseconds each where this costs about one. The OpenAPI schema
describes the same shape (`schemas.py`); tests hold the two together.

Types are strict: `"5"` is not a cost and `1` is not a boolean. A JSON body is parsed by
Python's json, which reads NaN and Infinity: both are refused here as costs.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from core.params import LARGEST_NUMBER

from .errors import invalid

MAX_KEY_LENGTH = 256
MAX_HOLD = 86_400.0


class DecisionRequest(NamedTuple):
    keys: dict[str, str]
    cost: float
    priority: str | None
    dry_run: bool


def number(value: Any, field: str, allow_zero: bool = False) -> float:
    """`value` as a cost-like number: finite, greater than 0 (or 0 with `allow_zero`), at most
    LARGEST_NUMBER; else a 400 naming `field`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(field, f"must be a number, not {kind_of(value)}")
    # The bounds first: math.isfinite() raises OverflowError on an int past a float's range.
    if value < 0 or value > LARGEST_NUMBER or (value == 0 and not allow_zero) or not math.isfinite(value):
        low = "at least 0" if allow_zero else "greater than 0"
        raise invalid(field, f"must be {low} and at most {LARGEST_NUMBER:.0e}, got {value!r}")
    return value


def number_from_text(raw: str, field: str) -> float:
    """`number` for a value written as text (a header's): `2`, `0.5`, `1e3`."""
    try:
        value = float(raw.strip())
    except ValueError:
        raise invalid(field, f"must be a number, not {raw!r}") from None
    return number(value, field)


_KINDS = {
    dict: "an object",
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    type(None): "null",
}


def kind_of(value: Any) -> str:
    """What a JSON value is, in JSON's words: "an object", "a number", "null"."""
    return _KINDS.get(type(value), type(value).__name__)


def _object(data: Any, path: str) -> dict:
    if not isinstance(data, dict):
        raise invalid(path, f"must be a JSON object, not {kind_of(data)}")
    return data


def _refuse_unknown(data: dict, known: tuple[str, ...], path: str) -> None:
    for name in data:
        if name not in known:
            raise invalid(f"{path}{name}", f"unknown field (known: {', '.join(known)})")


def parse_keys(value: Any, levels: tuple[str, ...], path: str = "keys") -> dict[str, str]:
    """`{level: key}` for configured levels only, each key a non-empty string."""
    if not isinstance(value, dict):
        raise invalid(path, f"must be an object mapping level names to keys, not {kind_of(value)}")
    if not value:
        raise invalid(path, f"must name at least one level (configured: {', '.join(levels) or 'none'})")
    for level, key in value.items():
        if level not in levels:
            raise invalid(f"{path}.{level}", f"level not configured (configured: {', '.join(levels) or 'none'})")
        if not isinstance(key, str) or not key:
            raise invalid(f"{path}.{level}", "must be a non-empty string")
        if len(key) > MAX_KEY_LENGTH:
            raise invalid(f"{path}.{level}", f"must be at most {MAX_KEY_LENGTH} characters")
        if not key.isascii() and not _encodable(key):
            # JSON's "\ud800" escapes give lone surrogates: no store can write them as UTF-8.
            raise invalid(f"{path}.{level}", "must not hold surrogate characters (U+D800 to U+DFFF)")
    return value


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_priority(value: Any, priorities, path: str = "priority") -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or value not in priorities:
        known = ", ".join(sorted(priorities)) or "none"
        raise invalid(path, f"unknown priority {value!r} (known: {known})")
    return value


DECISION_FIELDS = ("keys", "cost", "priority", "dry_run")


def parse_decision(data: Any, policy, path: str = "") -> DecisionRequest:
    """One decision request; `path` prefixes field names (`requests.3.`) inside a batch."""
    data = _object(data, path.rstrip(".") or "body")
    _refuse_unknown(data, DECISION_FIELDS, path)
    if "keys" not in data:
        raise invalid(f"{path}keys", "this field is required")
    keys = parse_keys(data["keys"], policy.levels, f"{path}keys")
    cost = number(data["cost"], f"{path}cost") if "cost" in data else 1
    priority = parse_priority(data.get("priority"), policy.priorities, f"{path}priority")
    dry_run = data.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise invalid(f"{path}dry_run", f"must be true or false, not {kind_of(dry_run)}")
    return DecisionRequest(keys, cost, priority, dry_run)


MAX_BATCH = 1000


def parse_batch(data: Any, policy) -> list[DecisionRequest]:
    data = _object(data, "body")
    _refuse_unknown(data, ("requests",), "")
    requests = data.get("requests")
    if not isinstance(requests, list):
        raise invalid("requests", f"must be an array of decision requests, not {kind_of(requests)}")
    if not requests:
        raise invalid("requests", "must hold at least one request")
    if len(requests) > MAX_BATCH:
        raise invalid("requests", f"at most {MAX_BATCH} requests per batch, got {len(requests)}")
    parsed = [parse_decision(item, policy, f"requests.{i}.") for i, item in enumerate(requests)]
    for i, request in enumerate(parsed):
        if request.dry_run:
            raise invalid(f"requests.{i}.dry_run", "a batch takes no dry runs; use /decisions")
    return parsed


RESERVATION_FIELDS = ("keys", "cost", "priority", "hold")


def parse_reservation(data: Any, policy) -> tuple[dict, float, str | None, float | None]:
    data = _object(data, "body")
    _refuse_unknown(data, RESERVATION_FIELDS, "")
    if "keys" not in data:
        raise invalid("keys", "this field is required")
    keys = parse_keys(data["keys"], policy.levels)
    cost = number(data["cost"], "cost") if "cost" in data else 1
    priority = parse_priority(data.get("priority"), policy.priorities)
    hold = data.get("hold")
    if hold is not None:
        hold = number(hold, "hold")
        if hold > MAX_HOLD:
            raise invalid("hold", f"must be at most {MAX_HOLD:.0f} seconds")
    return keys, cost, priority, hold


def parse_settlement(data: Any, required: bool) -> float | None:
    data = _object(data if data is not None else {}, "body")
    _refuse_unknown(data, ("actual_cost",) if required else (), "")
    if not required:
        return None
    if "actual_cost" not in data:
        raise invalid("actual_cost", "this field is required")
    return number(data["actual_cost"], "actual_cost", allow_zero=True)
