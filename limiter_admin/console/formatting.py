"""How the console writes things: durations, numbers, colours, local times, key names, and
the links between its pages and to the admin's."""

from __future__ import annotations

import hashlib
import math
from datetime import datetime
from urllib.parse import urlencode

from django.urls import reverse
from django.utils import timezone

from core import ConfigError, HierarchicalLimiter
from policies.compile import policy_cache
from policies.policy import TENANT_LEVEL, Policy

# Numbers ----------------------------------------------------------------------------------


def percent(part: int, whole: int) -> float:
    """`part` as a percentage of `whole`; 0 of nothing is 0 %."""
    return part / whole * 100 if whole else 0.0


def three_figures(value: float) -> str:
    """Three significant figures: 0.05, 0.0167, 123."""
    return f"{value:.3g}"


def two_decimals(value):
    """Two decimals: the store's floating point leaves crumbs (995.000004 tokens). Anything
    but a float (a count, None) as it is."""
    return round(value, 2) if isinstance(value, float) else value


# Time ------------------------------------------------------------------------------------


def local_time(epoch: float) -> datetime:
    """A Unix time in the console's time zone."""
    return datetime.fromtimestamp(epoch, tz=timezone.get_current_timezone())


def duration(seconds: float | None, never: str = "never", zero: str = "0 s") -> str:
    """`2.5 s`, `3 min 20 s`, `1 h 5 min`, `28 d 9 h` (from two days on); None or infinity is
    `never`."""
    if seconds is None or not math.isfinite(seconds):
        return never
    if seconds <= 0:
        return zero
    if seconds < 60:
        return f"{seconds:.2f} s" if seconds < 1 else f"{seconds:.1f} s".replace(".0 s", " s")
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours >= 48:
        days, hours = divmod(hours, 24)
        return f"{days} d {hours} h" if hours else f"{days} d"
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


# Names and colours -------------------------------------------------------------------------


# Hues a golden angle apart: however many rules a policy has, neighbours in the list differ most.
GOLDEN_ANGLE = 137.508


def rule_colour(name: str) -> str:
    """A rule's colour ("level: rule"): the same on every page, window and refresh while the
    policy is the same. The policy's own rules are spread around the colour wheel in the order
    of their names (no two alike, as hashing made `token_bucket(50, 10/s)` and `gcra(...)`);
    a name the policy no longer has (old denials) takes one from its hash."""
    colour = policy_colours(policy_cache().current()).get(name)
    if colour is not None:
        return colour
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).digest()
    hue = int.from_bytes(digest[:2], "big") * 360 // 65536
    return f"hsl({hue}, {55 + digest[2] % 25}%, {38 + digest[3] % 14}%)"


_colours: list = [None, {}]  # the policy the colours were worked out for, and they


def policy_colours(policy: Policy) -> dict[str, str]:
    """Each of the policy's rules ("level: rule", every tier's, override's and global one) by
    name: a hue a golden angle from the one before, lightness in three steps. Worked out once
    per policy read (a change of the policy is a new one)."""
    if _colours[0] is policy:
        return _colours[1]
    configs = [policy.config(tier) for tier in policy.tiers]
    configs += [policy.config(tenant.tier, tenant.overrides) for tenant in policy.tenants.values()]
    names: set[str] = set()
    for config in configs:
        try:
            limiter = HierarchicalLimiter.from_config(config)
        except ConfigError:
            continue  # a stored rule the engine no longer builds: its denials take a hashed colour
        names.update(f"{level}: {rule.display()}" for level, rules in limiter.levels.items() for rule in rules)
    colours = {
        name: f"hsl({round(i * GOLDEN_ANGLE) % 360}, 65%, {(40, 48, 34)[i % 3]}%)"
        for i, name in enumerate(sorted(names))
    }
    _colours[:] = [policy, colours]
    return colours


def key_name(level: str, key: str, team: str | None = None) -> str:
    """A key as the console names it: the team key alone, a user as `team / user`, any other
    key with its level (`global: *`)."""
    if level == TENANT_LEVEL:
        return key
    return f"{team} / {key}" if team else f"{level}: {key}"


# Links -------------------------------------------------------------------------------------


def bucket_url(level: str, key: str, team: str | None = None) -> str:
    """The dashboard's bucket panel for a key; a user key with the team whose tier applies."""
    query = {"level": level, "key": key, **({"team": team} if team and level != TENANT_LEVEL else {})}
    return f"{reverse('admin:dashboard')}?{urlencode(query)}#buckets"


def tenant_url(key: str) -> str:
    """The tenant page of team key `key`."""
    return reverse("admin:dashboard-tenant", args=[key])


def change_url(model_name: str, pk) -> str | None:
    """The admin's change page of a policies row (`tier`, `tenant`, `level`, ...); None
    without a row."""
    return reverse(f"admin:policies_{model_name}_change", args=[pk]) if pk is not None else None
