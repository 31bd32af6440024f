"""Top-ups of credits (a quota with `period: none`): which balance a top-up names, and how
much it may add. `HierarchicalLimiter.top_up` checks both, then adds it in the store."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .errors import InvalidRequest
from .params import LARGEST_NUMBER
from .rules import Rule


def credits_rule(rules: Sequence[Rule], selector: Any) -> Rule:
    """The rule of a level that `selector` names, its label or its index among `rules`; an
    InvalidRequest on `rule` unless it is one, and a balance of credits."""
    if isinstance(selector, int) and not isinstance(selector, bool):
        if not 0 <= selector < len(rules):
            raise InvalidRequest(f"no rule {selector} at this level (it has {len(rules)})", "rule")
        rule = rules[selector]
    elif isinstance(selector, str) and selector:
        named = [rule for rule in rules if rule.label == selector]
        if len(named) != 1:
            said = "no rule is labelled" if not named else f"{len(named)} rules are labelled"
            raise InvalidRequest(f"{said} {selector!r} at this level: name it by its index", "rule")
        rule = named[0]
    else:
        raise InvalidRequest("must be a rule's label or its index among the level's rules", "rule")
    if not rule.credits:
        raise InvalidRequest(f"{rule.display()} takes no top-up: only a quota with period none does", "rule")
    return rule


def clean_amount(amount: Any) -> float:
    """A top-up's amount: a number above 0 and at most LARGEST_NUMBER, else InvalidRequest."""
    if isinstance(amount, bool) or not isinstance(amount, (int, float)):
        raise InvalidRequest(f"must be a number, not {type(amount).__name__}", "amount")
    if not (0 < amount <= LARGEST_NUMBER and math.isfinite(amount)):
        raise InvalidRequest(f"must be greater than 0 and at most {LARGEST_NUMBER:.0e}, got {amount!r}", "amount")
    return float(amount)
