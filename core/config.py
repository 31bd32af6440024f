"""Turn config dicts into rules and priority classes, with errors that name the bad field.

The engine's config maps each level, in evaluation order, to its rule specs:
    {"user": [{"type": "token_bucket", "capacity": 3, "per_second": 1}], "team": [...]}
Priority classes map a name to a watermark and the levels it applies at:
    {"batch": {"watermark": 0.2, "levels": ["global"]}}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .rules import Rule, build_rule

DEFAULT_PRIORITY_LEVELS = ("global",)


@dataclass(frozen=True)
class PriorityClass:
    """A request class that must leave `watermark` x capacity untouched at its levels."""

    name: str
    watermark: float
    levels: frozenset[str]

    def floor(self, level: str, rule: Rule) -> float:
        """The reserve this class must leave in `rule` at `level`."""
        if not self.watermark or level not in self.levels or rule.capacity == float("inf"):
            return 0.0
        return self.watermark * rule.capacity


def parse_levels(config: Any) -> dict[str, list[Rule]]:
    """Build the rules of every level, keeping the config's level order."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"the config must map level names to rule lists, not {type(config).__name__}")
    levels: dict[str, list[Rule]] = {}
    for level, specs in config.items():
        if not isinstance(level, str) or not level.strip():
            raise ConfigError("a level name must be a non-empty string", repr(level))
        if not isinstance(specs, (list, tuple)):
            raise ConfigError(f"must be a list of rules, not {type(specs).__name__}", level)
        levels[level] = [build_rule(spec, f"{level}[{i}]") for i, spec in enumerate(specs)]
        _refuse_duplicates(level, levels[level])
    return levels


def _refuse_duplicates(level: str, rules: list[Rule]) -> None:
    # Two rules with the same type and parameters at one level would be one bucket.
    seen: dict[str, int] = {}
    for i, rule in enumerate(rules):
        if rule.rule_id in seen:
            j = seen[rule.rule_id]
            raise ConfigError(
                f"repeats rule {j} ({rules[j].describe()}) of this level: {rule.one_state}", f"{level}[{i}]"
            )
        seen[rule.rule_id] = i


def check_demotions(levels: Mapping[str, list[Rule]], priorities: Mapping[str, PriorityClass]) -> None:
    """ConfigError naming the field unless every rule's `demote_to` (a soft quota's) names
    one of the priority classes."""
    for level, rules in levels.items():
        for i, rule in enumerate(rules):
            if rule.demote_to is not None and rule.demote_to not in priorities:
                known = ", ".join(sorted(priorities)) or "none"
                raise ConfigError(
                    f"unknown priority class {rule.demote_to!r} (known: {known})", f"{level}[{i}].demote_to"
                )


def parse_priorities(config: Any, level_names: tuple[str, ...]) -> dict[str, PriorityClass]:
    """Build the priority classes; an unknown level or a watermark outside [0, 1) is refused."""
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise ConfigError("must map priority names to {watermark, levels}", "priorities")
    return {name: _priority(name, spec, level_names) for name, spec in config.items()}


def _priority(name: Any, spec: Any, level_names: tuple[str, ...]) -> PriorityClass:
    path = f"priorities.{name}"
    if not isinstance(name, str) or not name.strip():
        raise ConfigError("a priority name must be a non-empty string", path)
    if not isinstance(spec, Mapping):
        raise ConfigError("must be a mapping with a watermark", path)
    unknown = sorted(set(spec) - {"watermark", "levels"})
    if unknown:
        raise ConfigError(f"unknown field {unknown[0]!r} (known: levels, watermark)", path)
    watermark = spec.get("watermark", 0.0)
    if isinstance(watermark, bool) or not isinstance(watermark, (int, float)) or not 0 <= watermark < 1:
        raise ConfigError("must be a number from 0 up to (not including) 1", f"{path}.watermark")
    # By default a class protects the broadest level: `global`, or else the last one.
    default = DEFAULT_PRIORITY_LEVELS if "global" in level_names else level_names[-1:]
    levels = spec.get("levels", default)
    if not isinstance(levels, (list, tuple)):
        raise ConfigError("must be a list of level names", f"{path}.levels")
    for i, level in enumerate(levels):
        if level not in level_names:
            known = ", ".join(level_names)
            raise ConfigError(f"unknown level {level!r} (known: {known})", f"{path}.levels[{i}]")
    return PriorityClass(name, float(watermark), frozenset(levels))


FAIL_MODES = ("open", "closed", "local")
DEFAULT_FALLBACK_FRACTION = 0.25


@dataclass(frozen=True)
class FailMode:
    """What a level does while the store is unreachable: allow (`open`), deny (`closed`),
    or decide in process at `fallback_fraction` of its limits (`local`)."""

    mode: str = "open"
    fallback_fraction: float = DEFAULT_FALLBACK_FRACTION


def parse_fail_modes(config: Any, level_names: tuple[str, ...]) -> dict[str, FailMode]:
    """`{level: "open" | "closed" | "local" | {"fail_mode": ..., "fallback_fraction": ...}}`;
    a level left out fails open."""
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise ConfigError("must map level names to fail modes", "fail_modes")
    for level in config:
        if level not in level_names:
            raise ConfigError(f"unknown level (known: {', '.join(level_names)})", f"fail_modes.{level}")
    return {level: _fail_mode(config.get(level, "open"), f"fail_modes.{level}") for level in level_names}


def _fail_mode(spec: Any, path: str) -> FailMode:
    if isinstance(spec, str):
        spec = {"fail_mode": spec}
    if not isinstance(spec, Mapping):
        raise ConfigError("must be a fail mode or a mapping with fail_mode", path)
    unknown = sorted(set(spec) - {"fail_mode", "fallback_fraction"})
    if unknown:
        raise ConfigError(f"unknown field {unknown[0]!r} (known: fail_mode, fallback_fraction)", path)
    mode = spec.get("fail_mode", "open")
    if mode not in FAIL_MODES:
        raise ConfigError(f"must be one of {', '.join(FAIL_MODES)}, not {mode!r}", f"{path}.fail_mode")
    fraction = spec.get("fallback_fraction", DEFAULT_FALLBACK_FRACTION)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ConfigError("must be a number above 0 and at most 1", f"{path}.fallback_fraction")
    return FailMode(mode, float(fraction))
