"""What-if: recent traffic replayed under a draft policy, before anyone saves it.

    report = what_if({"tiers": {"pro": {"team": [{"type": "token_bucket", ...}]}}}, window=3600)

A draft is a policy document in the `loadpolicies` format, whole or partial, laid over the
policy in the database (`merge_draft`): a tier, tenant, level or priority class it names
changes, and only as far as it says. A tier's levels replace that level's rules of the tier
(`team: []` removes them); a tenant's `tier`, `overrides_until` and override levels replace
those; a level or priority class is replaced whole; `global` and `default_tier` when given
replace the policy's. Nothing is removed: what the draft leaves out stays as it is.

The merged document goes through `load_policy`, the loader `loadpolicies` runs, inside a
transaction that is always rolled back, and is read back by `read_policy` as any worker reads
a policy: a draft is refused exactly as `loadpolicies` refuses a file (ConfigError naming the
path and the reason) and compiled exactly as a saved policy would be. Nothing is written.

The recorded requests of the window (core.recorder) are then replayed under the current
policy and under the draft (core.replay), each from full buckets at the window's start.
"""

from __future__ import annotations

import copy
import datetime
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from django.db import transaction

from core import ConfigError
from core.replay import Comparison, TenantImpact, compare

from .api.observe import decision_recorder
from .compile import TENANT_LEVEL, Policy, read_policy
from .policyfile import TOP_LEVEL_FIELDS, check_levels, export_policy, load_policy

# Tenants listed in an answer by default, and at most (the totals count every tenant).
TOP_TENANTS = 100
MAX_TOP_TENANTS = 10_000
# The series has about this many points, whatever the window (each a whole number of minutes).
SERIES_POINTS = 60


class _Rollback(Exception):
    """Raised to leave the draft's transaction (nothing of it is ever kept)."""


def merge_draft(current: Mapping[str, Any], draft: Any) -> dict:
    """The policy document `current` with `draft` laid over it (see the module's docstring).
    Where the draft's shape is wrong its value is kept as it is, so that checking the merged
    document refuses it at the path the draft gave it."""
    if draft is None:
        draft = {}
    if not isinstance(draft, Mapping):
        raise ConfigError(f"must be a mapping, not {type(draft).__name__}", "")
    merged = copy.deepcopy(dict(current))
    if set(draft) - set(TOP_LEVEL_FIELDS):
        return {**merged, **draft}  # refused for its unknown field, as loadpolicies refuses it
    for section, value in draft.items():
        if section == "levels":
            # Checked alone, so that a refusal names the draft's own index.
            merged["levels"] = _merge_levels(merged.get("levels", []), check_levels(value))
        elif section in ("tiers", "tenants", "priorities") and isinstance(value, Mapping):
            merged[section] = _merge_named(section, merged.get(section) or {}, value)
        elif section == "priorities" and value is None:
            continue  # as the policy file reads it: no priority classes given
        else:
            merged[section] = value
    return merged


def _merge_levels(current: list, drafted: list[dict]) -> list:
    by_name = {level["name"]: level for level in drafted}
    out = [by_name.pop(level["name"], level) for level in current]
    return out + [level for level in drafted if level["name"] in by_name]


def _merge_named(section: str, current: Mapping[str, Any], drafted: Mapping[Any, Any]) -> dict:
    out = dict(current)
    for name, spec in drafted.items():
        old = out.get(name)
        if section == "tiers" and isinstance(old, Mapping) and isinstance(spec, Mapping):
            out[name] = {**old, **spec}
        elif section == "tenants" and isinstance(old, Mapping) and (spec is None or isinstance(spec, Mapping)):
            spec = spec or {}
            tenant = {**old, **spec}
            if isinstance(old.get("overrides"), Mapping) and isinstance(spec.get("overrides"), Mapping):
                tenant["overrides"] = {**old["overrides"], **spec["overrides"]}
            out[name] = tenant
        else:
            out[name] = spec
    return out


def draft_policies(draft: Any) -> tuple[Policy, Policy]:
    """(the policy in the database, the draft laid over it), both as workers compile them.
    Raises ConfigError naming the draft's bad field; writes nothing."""
    current = read_policy()
    merged = merge_draft(export_policy(), draft)
    drafted: Policy | None = None
    try:
        with transaction.atomic():
            load_policy(merged)
            drafted = read_policy()
            raise _Rollback
    except _Rollback:
        pass
    assert drafted is not None
    return current, drafted


def series_step(window: float) -> int:
    """Seconds per point of the series: whole minutes, about SERIES_POINTS points."""
    return 60 * max(1, math.ceil(window / 60 / SERIES_POINTS))


def what_if(
    draft: Any,
    window: float,
    top: int = TOP_TENANTS,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """The recorded requests of the last `window` seconds replayed under the current policy
    and under `draft`: per tenant (the `top` most newly denied), in all, and over time."""
    current, drafted = draft_policies(draft)
    return replay_window(current, drafted, window, top, progress)


def replay_window(
    current: Policy,
    drafted: Policy,
    window: float,
    top: int = TOP_TENANTS,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """`what_if` once the policies are read (no database: a background thread may run it)."""
    recorder = decision_recorder()
    end = recorder.clock() if recorder is not None else time.time()
    start = end - window
    records = recorder.records(start, end) if recorder is not None else []
    step = series_step(window)
    result = compare(records, current, drafted, start, end, step, TENANT_LEVEL, progress)
    return answer(result, current, drafted, start, end, step, top, recording=recorder is not None)


def answer(
    result: Comparison,
    current: Policy,
    drafted: Policy,
    start: float,
    end: float,
    step: int,
    top: int,
    recording: bool = True,
) -> dict:
    """The what-if's answer, as the REST API, the command and the console show it."""
    ranked = sorted(result.tenants.items(), key=lambda item: _rank(*item))
    return {
        "window": {"start": start, "end": end},
        "step": step,
        "recording": recording,
        "replayed": result.replayed,
        "tenants": [
            {"tenant": key, "tier_now": tier_of(current, key), "tier_draft": tier_of(drafted, key), **_counts(impact)}
            for key, impact in ranked[:top]
        ],
        "tenants_total": len(ranked),
        "totals": {**_counts(result.totals), "blocked_by_now": _most_first(result.totals.blocked_by_now)},
        "series": [
            {
                "start": point.start,
                "decisions": point.decisions,
                "denied_now": point.denied_now,
                "denied_draft": point.denied_draft,
            }
            for point in result.series
        ],
    }


def _rank(key: str, impact: TenantImpact) -> tuple:
    return (-impact.newly_denied, -impact.denied_draft, -impact.decisions, key)


def _counts(impact: TenantImpact) -> dict:
    return {
        "decisions": impact.decisions,
        "allowed_now": impact.allowed_now,
        "allowed_draft": impact.allowed_draft,
        "newly_denied": impact.newly_denied,
        "newly_allowed": impact.newly_allowed,
        "blocked_by_draft": _most_first(impact.blocked_by_draft),
    }


def _most_first(counts: Mapping[str, int]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def tier_of(policy: Policy, team_key: str) -> str | None:
    """The tier a team key resolves to under `policy` (its tenant's, else the default)."""
    tenant = policy.tenants.get(team_key)
    return tenant.tier if tenant is not None else policy.default_tier


def what_if_table(report: dict) -> str:
    """The answer as a plain-text table: one row per tenant listed, then the totals."""
    columns: tuple[str, ...] = (
        "tenant",
        "tier now",
        "tier draft",
        "decisions",
        "allowed now",
        "allowed draft",
        "newly denied",
    )
    columns += ("newly allowed", "draft's denials by blocked_by")
    rows = [
        (
            row["tenant"],
            row["tier_now"] or "-",
            row["tier_draft"] or "-",
            *(
                str(row[name])
                for name in ("decisions", "allowed_now", "allowed_draft", "newly_denied", "newly_allowed")
            ),
            _blocked_text(row["blocked_by_draft"]),
        )
        for row in report["tenants"]
    ]
    totals = report["totals"]
    rows.append(
        (
            "(all)",
            "",
            "",
            *(
                str(totals[name])
                for name in ("decisions", "allowed_now", "allowed_draft", "newly_denied", "newly_allowed")
            ),
            _blocked_text(totals["blocked_by_draft"]),
        )
    )
    widths = [max(len(column), *(len(row[i]) for row in rows)) for i, column in enumerate(columns)]
    numeric = range(3, 8)

    def line(cells) -> str:
        return "  ".join(
            cell.rjust(width) if i in numeric else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(cells, widths))
        ).rstrip()

    start, end = (_utc(report["window"][edge]) for edge in ("start", "end"))
    head = [f"What if: {report['replayed']} recorded requests from {start} to {end}, replayed under each policy."]
    if not report["recording"]:
        head.append("Recording is off (LIMITER_RECORD_LIMIT=0): there is nothing to replay.")
    shown = len(report["tenants"])
    if shown < report["tenants_total"]:
        head.append(f"The {shown} most newly denied of {report['tenants_total']} tenants; (all) counts every one.")
    return "\n".join([*head, "", line(columns), line("-" * width for width in widths), *map(line, rows)]) + "\n"


def _blocked_text(counts: Mapping[str, int]) -> str:
    return "; ".join(f"{name} x{count}" for name, count in counts.items()) or "-"


def _utc(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
