"""A tenant's limits changed on the spot, beyond editing rows in the admin: a quick raise of one
limit for a few hours, and a reset of a key's buckets.

The rows and their checks are the domain's (policies.overrides writes the expiring override
through the same rows and invariants as any override); this layer picks the clock, the
limiter and makes the change reach this worker at once.
"""

from __future__ import annotations

from datetime import UTC, datetime

from ..compile import policy_cache
from ..overrides import Raised
from ..overrides import raise_limit as write_raise


def raise_limit(key: str, level: str, rule: str, factor: float, hours: float, version: int) -> Raised:
    """Raise `rule` (as blocked_by names it, without its level) at `level` for team key `key`
    by `factor` for `hours`, if the tenant is still at `version` (0: no tenant row yet).
    Raises StaleVersion or QuickRaiseRefused (policies.overrides). This worker decides with
    the raise at once, the others within a second."""
    # The policy's own clock: the one that decides when the override stops applying.
    now = datetime.fromtimestamp(policy_cache().clock(), UTC)
    raised = write_raise(key, level, rule, factor, hours, version, now)
    policy_cache().refresh()
    return raised


def key_rules(level: str, team_key: str | None) -> list[str]:
    """The stateful rules that hold state for a key at `level` (its buckets), by the names
    blocked_by gives them; `team_key` picks the tenant whose rules apply."""
    rules = policy_cache().limiter_for(team_key).levels.get(level, [])
    return [f"{level}: {rule.display()}" for rule in rules if rule.stateful]


def reset_buckets(level: str, key: str, team_key: str | None) -> None:
    """Forget the state of every rule of `key` at `level`: its buckets start full. Raises
    StoreUnavailable when the store cannot be reached (nothing was reset)."""
    policy_cache().limiter_for(team_key).reset(level, key)
