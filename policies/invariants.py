"""The invariants of a policy, each stated once. The admin, the REST API and the policy file
(`loadpolicies`) all call these functions; none of them words a policy rule of its own.

Pure: specs in, violations out. Nothing here reads a row; the invariants that need the stored
rows (a change checked against every owner's rules, a row still in use) are in
`policies.integrity`, above the models, and call these.

A violation is a `PolicyViolation`, a core.ConfigError, so a policy file reports it as it
reports any bad field: `path` says where, relative to what was checked (`user[1]`,
`capacity`), and `reason` says why, in the same words whichever path refused it. A
`PolicyConflict` clashes with what is stored (a name taken, a rule that repeats one already
at its level, a row still in use): the API answers it with a 409, where a violation is a 400.

Inventory: every invariant, where it was checked before, and where it lives now.

1. A level's, tier's or priority class's name is letters, digits and _ . : -, to its very
   end. Was: the models' validator, a copy of it in the serializers, and the file's own
   check with its own message. Now: `NAME_VALIDATOR`, on the model fields and the API's
   fields; `check_name` for the file.
2. Names (and tenant keys) are unique. Was: the database and each model's validate_unique,
   worded by Django for the admin and anew by the API. Now: the database; `taken` words it
   (`Versioned.unique_error_message`), and the API's 409 repeats the model's message.
3. A level's fail mode is open, closed or local; its fallback fraction is above 0 and at
   most 1. Was: Level.clean and the file, each calling core.config its own way. Now:
   `check_fail_mode` (Level.clean, hence the admin and the API; the file).
4. A priority class's watermark is from 0 up to (not including) 1. Was: PriorityClass.clean
   and the file's core.config.parse_priorities. Now: `check_watermark` (the model, hence the
   admin and the API); the file's priorities go through the same core.config function.
5. A rule builds with the engine (a registered type, its declared parameters in bounds, a
   label, shadow and counts it takes) and fits the row that keeps it (a label of at most 64
   characters). Was: Rule.clean (`check_rule_spec`), the serializers (the engine, then the
   row's full_clean) and the file (the engine, then `_check_row_fields`). Now: `check_rule`.
6. A rule belongs to a tier, a tenant or neither (a global rule), never both: Rule.clean and
   a database constraint (neither the API nor a file can say both). Unchanged.
7. A tier has at least one rule. Was: the admin's inline formset, the tier serializer and
   the file, in three wordings; not checked when a tier's last rule was deleted, or moved to
   another owner, on the rule's own page. Now: `check_owner_rules`, and `check_rule_rows`
   for the rule page and its delete action.
8. No rule repeats another at its level, counting the level's global rules: the same type
   and parameters are one bucket, whatever the label. Was: the admin (`check_with_global_rules`
   in admin.py, which the API imported, and its own loop on the rule page), the API
   (its own refuse_repeats) and the file (`_check_compiles`), each with its own message. Now:
   `check_owner_rules`, `check_global_rules` and `check_rule_rows`.
9. What a policy names exists: a tenant's tier, the default tier, a priority class's levels,
   the levels rules are keyed by. The admin offers only existing rows; the API and the file
   look names up, and `unknown` words a miss for both.
10. A tier that is the default tier or has tenants, and a level that has rules or that a
    priority class applies at, are not deleted. Was: the database (PROTECT, which does not
    cover a priority class's levels) and the API's views; the admin deleted a level that
    priority classes used without a word, and those classes fell back to `global`. Now:
    `check_deletable`, called by the API, the admin (`get_deleted_objects`, which also
    serves its bulk delete action) and the loader.
12. A soft quota's `demote_to` names a priority class of the policy: `check_demotions` (the
    file, the API, the admin), and a priority class a quota demotes to is not deleted
    (`check_deletable`).
11. A row changed since it was read is not saved over it (optimistic locking): one place,
    `Versioned.save`. The admin's page and the API compare the version first only to word
    the refusal for their reader. Unchanged.
12. An alert (issue 21) has a known kind and format, a threshold above 0 and at most 1, a
    window for `denied_share` alone (1 minute to 24 hours, in whole minutes, hours or a day:
    the statistics count whole minutes), a webhook URL of http or https with a host (a
    pattern the REST schema states too), and a secret. New: `check_alert`
    for the file, and its parts (`check_alert_kind`, `check_threshold`, `check_alert_window`,
    `check_webhook_url`, `check_alert_format`, `check_alert_secret`) for the Alert row's clean,
    hence the admin and the API.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MaxLengthValidator, RegexValidator

from core import ConfigError
from core.config import DEFAULT_FALLBACK_FRACTION, FailMode, parse_fail_modes, parse_priorities
from core.rules import build_rule

from .durations import MAX_WINDOW, whole_numbers_up_to, window_pattern, window_seconds

# \A and \Z, not ^ and $: `$` also matches before a trailing newline.
NAME_VALIDATOR = RegexValidator(r"\A[A-Za-z0-9_.:-]+\Z", "Letters, digits and _ . : - only.")
# What the Rule row keeps of a spec: its label and type in columns of this many characters
# (policies.models declares the columns with these).
MAX_LABEL = 64
MAX_RULE_TYPE = 64
# A level's, tier's or priority class's name, in its column.
MAX_NAME = 64
# A spec's keys that the Rule row keeps in columns of their own; every other key is a parameter.
SPEC_FIELDS = ("type", "label", "shadow", "counts")

RuleSpecs = Mapping[str, list[Any]]  # rule specs by level name, as the policy file spells them


class PolicyViolation(ConfigError):
    """A change that would break an invariant of the policy: `reason` says which, `path`
    where (relative to what was checked)."""

    conflict = False


class PolicyConflict(PolicyViolation):
    """A violation that clashes with what is stored: a name taken, a rule that repeats one
    already at its level, a row still in use."""

    conflict = True


def within(path: str, error: ConfigError) -> PolicyViolation:
    """`error` with its path put under `path` (`tiers.pro` and `user[1]`: `tiers.pro.user[1]`)."""
    inner = error.path.lstrip(".")
    where = f"{path}.{inner}" if path and inner else path or inner
    kind = PolicyConflict if getattr(error, "conflict", False) else PolicyViolation
    return kind(error.reason, where)


# Names ---------------------------------------------------------------------------------------


def unknown(kind: str, name: Any, known: Iterable[str]) -> str:
    """The reason for a name that names no row: `unknown tier 'gold' (known: free, pro)`."""
    return f"unknown {kind} {name!r} (known: {', '.join(known) or 'none'})"


def taken(kind: str, name: Any) -> str:
    """The reason for a name another row holds: `tier 'pro' already exists`."""
    return f"{kind} {name!r} already exists"


def check_name(value: Any) -> str:
    """A level's, tier's or priority class's name (invariant 1)."""
    try:
        NAME_VALIDATOR(value if isinstance(value, str) else "")
    except ValidationError:
        raise PolicyViolation(str(NAME_VALIDATOR.message)) from None
    return value


def check_name_length(value: str) -> str:
    """A name no longer than its column holds (MAX_NAME), as the row's `name` field says."""
    try:
        MaxLengthValidator(MAX_NAME)(value)
    except ValidationError as error:
        raise PolicyViolation(" ".join(error.messages)) from None
    return value


# Levels and priority classes -------------------------------------------------------------------


def check_fail_mode(fail_mode: Any, fallback_fraction: Any = DEFAULT_FALLBACK_FRACTION) -> FailMode:
    """What a level does while the store is down (invariant 3); the path names the field."""
    try:
        return parse_fail_modes({"_": {"fail_mode": fail_mode, "fallback_fraction": fallback_fraction}}, ("_",))["_"]
    except ConfigError as error:
        raise PolicyViolation(error.reason, error.path.rsplit(".", 1)[-1]) from None


def check_watermark(watermark: Any) -> float:
    """The share of capacity a priority class leaves (invariant 4); the path is `watermark`."""
    try:
        return parse_priorities({"_": {"watermark": watermark}}, ("global",))["_"].watermark
    except ConfigError as error:
        raise PolicyViolation(error.reason, "watermark") from None


# Rules -----------------------------------------------------------------------------------------


def check_rule(spec: Any, path: str = "") -> None:
    """One rule spec builds with the engine and fits the Rule row that keeps it (invariant 5)."""
    try:
        build_rule(spec, "")
    except ConfigError as error:
        raise within(path, error) from None
    for field, most in (("type", MAX_RULE_TYPE), ("label", MAX_LABEL)):
        try:
            MaxLengthValidator(most)(spec.get(field) or "")
        except ValidationError as error:
            raise within(path, PolicyViolation(" ".join(error.messages), field)) from None


def check_owner_rules(kind: str, rules: RuleSpecs, global_rules: RuleSpecs) -> None:
    """The rules of one tier or tenant (`kind`), with the global rules of each level: each
    builds, a tier has one at least (invariant 7), and none repeats another at its level, its
    owner's or a global one (invariant 8). The path names the owner's rule (`user[1]`).
    policies.integrity.check_owner checks them against the stored global rules."""
    for level, specs in rules.items():
        for i, spec in enumerate(specs):
            check_rule(spec, f"{level}[{i}]")
    if kind == "tier" and not any(rules.values()):
        raise PolicyViolation("a tier needs at least one rule")
    refuse_repeats(rules, global_rules)


def check_demotions(rules: RuleSpecs, priorities: Iterable[str]) -> None:
    """Every soft quota's `demote_to` names one of the policy's priority classes (invariant
    12): a request past it is decided under that class's watermarks. The path names the rule."""
    known = set(priorities)
    for level, specs in rules.items():
        for i, spec in enumerate(specs):
            name = spec.get("demote_to") if isinstance(spec, Mapping) else None
            if name is not None and name not in known:
                raise PolicyViolation(unknown("priority class", name, sorted(known)), f"{level}[{i}].demote_to")


def check_global_rules(global_rules: RuleSpecs) -> None:
    """The global rules among themselves: each builds, and none repeats another at its level."""
    for level, specs in global_rules.items():
        for i, spec in enumerate(specs):
            check_rule(spec, f"{level}[{i}]")
    refuse_repeats(global_rules, {})


def refuse_repeats(rules: RuleSpecs, global_rules: RuleSpecs) -> None:
    """No rule of `rules` repeats another at its level, or one of the level's global rules:
    two rules with the engine's same rule_id are one state (each rule type's `one_state`
    says why)."""
    for level, specs in rules.items():
        seen = {}
        for j, spec in enumerate(global_rules.get(level, [])):
            built = build_rule(spec, "")
            seen[built.rule_id] = f"global rule {j} ({built.display()})"
        for i, spec in enumerate(specs):
            built = build_rule(spec, "")
            if built.rule_id in seen:
                raise PolicyConflict(f"repeats {seen[built.rule_id]} of this level: {built.one_state}", f"{level}[{i}]")
            seen[built.rule_id] = f"rule {i} ({built.display()})"


# Alerts ------------------------------------------------------------------------------------------

ALERT_KINDS = ("quota_used", "denied_share")
ALERT_FORMATS = ("json", "slack")
# The fields of an alert as the policy file and the API spell them (`secret` is written only).
ALERT_FIELDS = ("kind", "threshold", "window", "url", "secret", "format", "enabled")
MAX_URL = 2000
MAX_SECRET = 200
MAX_WINDOW_TEXT = 16
# A denied share's window: whole minutes, hours or a day, 1m to 24h (the statistics count
# whole minutes). The REST schema states it with this pattern, the invariant reads it so.
ALERT_WINDOW_PATTERN = window_pattern(MAX_WINDOW, units="mhd")
# A webhook URL: http or https, a host (a name of letters, digits, dots and dashes, or an IP
# address; a name outside ASCII as its punycode), an optional port from 1 to 65535, then
# printable ASCII. The REST schema states it with this pattern, the invariant reads it so.
WEBHOOK_URL_PATTERN = (
    r"https?://(?:[A-Za-z0-9._~%!$&'()*+,;=:-]+@)?(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])"
    rf"(?::(?:{whole_numbers_up_to(65535)}))?(?:[/?#][!-~]*)?"
)


def check_alert_kind(kind: Any) -> str:
    """`quota_used` or `denied_share` (invariant 12); the path is `kind`."""
    if kind not in ALERT_KINDS:
        raise PolicyViolation(f"must be one of {', '.join(ALERT_KINDS)}, got {kind!r}", "kind")
    return kind


def check_threshold(threshold: Any) -> float:
    """A share above 0 and at most 1 (invariant 12); the path is `threshold`."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise PolicyViolation(f"must be a number above 0 and at most 1, got {threshold!r}", "threshold")
    if not 0 < threshold <= 1:
        raise PolicyViolation(f"must be above 0 and at most 1 (a share: 0.8 is 80%), got {threshold!r}", "threshold")
    return float(threshold)


def check_alert_window(kind: str, window: Any) -> int | None:
    """A `denied_share` alert's window in seconds (1m to 24h, in whole minutes, hours or a
    day); no window for any other kind (invariant 12). The path is `window`."""
    given = window not in (None, "")
    if kind != "denied_share":
        if given:
            raise PolicyViolation("only a denied_share alert has a window: leave it out", "window")
        return None
    if not given:
        raise PolicyViolation("a denied_share alert needs a window, like 5m", "window")
    seconds = window_seconds(window, ALERT_WINDOW_PATTERN)
    if seconds is None:
        raise PolicyViolation(f"must be a duration from 1m to 24h, like 5m, 90m or 1h; got {window!r}", "window")
    return seconds


def check_webhook_url(url: Any) -> str:
    """An http or https URL with a host (WEBHOOK_URL_PATTERN), of at most MAX_URL characters
    (invariant 12); the path is `url`."""
    if not isinstance(url, str) or not url:
        raise PolicyViolation("a webhook URL is required: http:// or https://", "url")
    if len(url) > MAX_URL:
        raise PolicyViolation(f"must be a URL of at most {MAX_URL} characters", "url")
    if re.fullmatch(WEBHOOK_URL_PATTERN, url):
        return url
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", url)
    if scheme is None or scheme.group(1) not in ("http", "https"):
        named = f"{scheme.group(1)}:" if scheme else "one without a scheme"
        raise PolicyViolation(f"must be an http:// or https:// URL, not {named}", "url")
    if re.match(r"https?://[/?#]|https?://$|https?:(?!//)", url):
        raise PolicyViolation("must name a host, like https://hooks.example.com/limiter", "url")
    raise PolicyViolation(
        "is not a valid URL: a host name of letters, digits, dots and dashes (or an IP address), a port "
        "from 1 to 65535, and no spaces or characters outside ASCII (percent-encode them)",
        "url",
    )


def check_alert_format(format: Any) -> str:
    """`json` or `slack` (invariant 12); the path is `format`."""
    if format not in ALERT_FORMATS:
        raise PolicyViolation(f"must be one of {', '.join(ALERT_FORMATS)}, got {format!r}", "format")
    return format


def check_alert_secret(secret: Any) -> str:
    """The key deliveries are signed with: a non-empty string of at most MAX_SECRET
    characters (invariant 12); the path is `secret`."""
    if not isinstance(secret, str) or not secret:
        raise PolicyViolation("a secret is required: deliveries are signed with it", "secret")
    if len(secret) > MAX_SECRET:
        raise PolicyViolation(f"must be at most {MAX_SECRET} characters", "secret")
    return secret


def check_alert(spec: Any, secret_required: bool = True) -> dict:
    """An alert as the policy file spells it (ALERT_FIELDS), checked and normalised: every
    field but `window` (for `denied_share` only) and `secret` (when not `secret_required`:
    the store keeps the one it has) is filled in. The path names the field."""
    if not isinstance(spec, Mapping):
        raise PolicyViolation(f"must be a mapping, not {type(spec).__name__}")
    extra = sorted(set(spec) - set(ALERT_FIELDS))
    if extra:
        raise PolicyViolation(f"unknown field (known: {', '.join(sorted(ALERT_FIELDS))})", extra[0])
    kind = check_alert_kind(spec.get("kind"))
    out: dict[str, Any] = {"kind": kind, "threshold": check_threshold(spec.get("threshold"))}
    if check_alert_window(kind, spec.get("window")) is not None:
        out["window"] = spec["window"]
    out["url"] = check_webhook_url(spec.get("url"))
    if "secret" in spec or secret_required:
        out["secret"] = check_alert_secret(spec.get("secret"))
    out["format"] = check_alert_format(spec.get("format", "json"))
    enabled = spec.get("enabled", True)
    if not isinstance(enabled, bool):
        raise PolicyViolation(f"must be true or false, got {enabled!r}", "enabled")
    out["enabled"] = enabled
    return out
