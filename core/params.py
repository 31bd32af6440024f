"""Parameter declarations: a rule type states its parameters once, and validation,
forms and schemas are all derived from that one statement."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .errors import ConfigError

REQUIRED: Any = object()

# The kinds a parameter can have, and the JSON-schema type each one maps to. A "choice" is one
# of the parameter's `choices` (strings).
KINDS = {"number": "number", "integer": "integer", "string": "string", "choice": "string", "strings": "array"}

# Bigger than any real limit, small enough that float arithmetic stays exact on counts.
LARGEST_NUMBER = 1e15


@dataclass(frozen=True)
class Param:
    """One declared parameter of a rule type: its name, kind, bounds (a choice's `choices`)
    and help text. A `default` of None makes it optional with no value: None is then taken
    as leaving it out. `names`: the value names something the policy around the engine
    configures ("priority": a priority class), which its schema can list where it knows them."""

    name: str
    kind: str = "number"
    help: str = ""
    minimum: float | None = None
    exclusive_minimum: bool = False
    maximum: float = LARGEST_NUMBER
    default: Any = REQUIRED
    choices: tuple[str, ...] = ()
    names: str = ""
    # How a choice refuses a value not among its choices ({value!r} is filled in); by default
    # it lists them, or says how many there are.
    refusal: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Param {self.name!r}: kind must be one of {sorted(KINDS)}")
        if (self.kind == "choice") != bool(self.choices):
            raise ValueError(f"Param {self.name!r}: a choice, and only a choice, has choices")
        if self.kind == "choice" and self.default not in (REQUIRED, None, *self.choices):
            raise ValueError(f"Param {self.name!r}: the default must be one of its choices")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def clean(self, value: Any, path: str) -> Any:
        """Return the value in its canonical type, or raise ConfigError naming the field."""
        where = f"{path}.{self.name}" if path else self.name
        if value is None and self.default is None:
            return None
        if self.kind in ("number", "integer"):
            return self._clean_number(value, where)
        if self.kind == "string":
            if not isinstance(value, str) or not value:
                raise ConfigError("must be a non-empty string", where)
            return value
        if self.kind == "choice":
            if not isinstance(value, str) or value not in self._allowed:
                if self.refusal and isinstance(value, str) and value:
                    raise ConfigError(self.refusal.format(value=value), where)
                raise ConfigError(f"must be {self._one_of()}, not {value!r}", where)
            return value
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError("must be a list of strings", where)
        return tuple(value)

    @cached_property
    def _allowed(self) -> frozenset[str]:
        return frozenset(self.choices)

    def _one_of(self) -> str:
        """The choices as a refusal words them: all of a few, or how many with two of them."""
        if len(self.choices) <= 12:
            return f"one of {', '.join(self.choices)}"
        return f"one of the {len(self.choices)} known names, such as {self.choices[0]} or {self.default}"

    def _clean_number(self, value: Any, where: str) -> float | int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"must be a number, not {type(value).__name__}", where)
        if isinstance(value, int) and abs(value) > sys.float_info.max:
            value = math.inf if value > 0 else -math.inf  # past a float's range: math.isfinite() would raise
        if not math.isfinite(value):
            raise ConfigError("must be a finite number", where)
        if self.kind == "integer":
            if value != int(value):
                raise ConfigError("must be a whole number", where)
            value = int(value)
        self._check_bounds(value, where)
        return value

    def _check_bounds(self, value: float, where: str) -> None:
        low = self.minimum
        if low is not None and (value < low or (self.exclusive_minimum and value == low)):
            word = "greater than" if self.exclusive_minimum else "at least"
            raise ConfigError(f"must be {word} {format_number(low)}, got {format_number(value)}", where)
        if value > self.maximum:
            raise ConfigError(f"must be at most {format_number(self.maximum)}, got {format_number(value)}", where)

    def schema(self) -> dict:
        """A JSON-schema fragment for this parameter (used by forms and the OpenAPI schema)."""
        out: dict[str, Any] = {"type": KINDS[self.kind], "description": self.help}
        if self.kind in ("number", "integer"):
            if self.minimum is not None:
                key = "exclusiveMinimum" if self.exclusive_minimum else "minimum"
                out[key] = self.minimum
            out["maximum"] = self.maximum
        if self.kind == "strings":
            out["items"] = {"type": "string"}
        if self.kind == "choice":
            out["enum"] = list(self.choices)
        if self.default is None:  # optional: null, or left out, is no value
            out["type"] = [out["type"], "null"]
            if "enum" in out:
                out["enum"].append(None)
        if not self.required:
            out["default"] = self.default
        return out


def format_number(value: Any) -> str:
    """Numbers in messages, rule names and forms: 10 rather than 10.0, 0.5 as it is; a value
    that is not a number (a bool, a text) as str() gives it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e16 else repr(value)


def clean_params(params: tuple[Param, ...], given: dict, path: str) -> dict:
    """Validate `given` against the declared params: unknown, missing and bad fields are named."""
    declared = {p.name for p in params}
    unknown = sorted(set(given) - declared)
    if unknown:
        known = ", ".join(sorted(declared)) or "none"
        raise ConfigError(f"unknown parameter {unknown[0]!r} (known: {known})", path)
    values = {}
    for param in params:
        if param.name in given:
            values[param.name] = param.clean(given[param.name], path)
        elif param.required:
            where = f"{path}.{param.name}" if path else param.name
            raise ConfigError("is required", where)
        else:
            values[param.name] = param.default
    return values
