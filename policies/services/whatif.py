"""What-if: recent traffic replayed under a draft policy, before anyone saves it.

    report = what_if({"tiers": {"pro": {"team": [{"type": "token_bucket", ...}]}}}, window=3600)

A draft is a policy document in the `loadpolicies` format, whole or partial, laid over the
policy in the database (`merge_draft`): a tier, tenant, level or priority class it names
changes, and only as far as it says. A tier's levels replace that level's rules of the tier
(`team: []` removes them); a tenant's `tier`, `overrides_until` and override levels replace
those; a level or priority class is replaced whole; `global` and `default_tier` when given
replace the policy's. Nothing is removed: what the draft leaves out stays as it is.

The merged document goes through `check_document`, the checks `loadpolicies` runs before it
writes anything, and becomes the Policy that loading it would give (`document_policy`): a
draft is refused as `loadpolicies` refuses a file (ConfigError naming the path and the
reason) and compiled as a saved policy would be. Nothing is written, so no draft holds a
write lock on the database, however large. A draft names at most LIMITER_WHATIF_MAX_TENANTS
tenants and LIMITER_WHATIF_MAX_RULES rules (Invalid naming the cap).

The recorded requests of the window (core.recorder) are then replayed under the current
policy and under the draft (core.replay), each from full buckets at the window's start. A
replay is seconds of pure Python, so it runs in a process of its own at the lowest CPU
priority (policies/replay_child.py), never in a web worker's threads: a gateway's decision
does not wait behind it. At most LIMITER_WHATIF_CONCURRENCY replays run at once in the whole
deployment (a concurrency slot in the limiter's own store: we are a rate limiter), each
worker queues at most LIMITER_WHATIF_QUEUE more (`REPLAYS`; Busy past them), and a replay
is stopped after LIMITER_WHATIF_SECONDS (Invalid naming the window that was too long).
"""

from __future__ import annotations

import copy
import datetime
import math
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from django.conf import settings

from core import ConfigError, HierarchicalLimiter
from core.replay import Comparison, TenantImpact

from ..compile import read_policy
from ..invariants import PolicyConflict
from ..policy import TENANT_LEVEL, Policy
from ..policyfile import TOP_LEVEL_FIELDS, check_document, check_levels, document_policy, export_policy
from ..replay_child import Job
from ..stores import limiter_store
from ..telemetry import decision_recorder
from .errors import Busy, invalid
from .jobs import JobPool, TimedOut, in_child
from .usage import parse_window

# Tenants listed in an answer by default, and at most (the totals count every tenant).
TOP_TENANTS = 100
MAX_TOP_TENANTS = 10_000
# The series has about this many points, whatever the window (each a whole number of minutes).
SERIES_POINTS = 60
# This worker's replays: one at a time (its process holds a core), the rest waiting.
REPLAYS = JobPool("whatif", workers=1, waiting=settings.LIMITER_WHATIF_QUEUE)
REQUEST_FIELDS = ("policy", "window", "top")
# The deployment's replay slots: a concurrency rule at a level of their own, on the limiter's store.
SLOT_KEYS = {"whatif": "replays"}
SLOT_POLL = 0.25  # seconds between two asks for a slot while every slot is taken


def parse_what_if(data: Any) -> tuple[Any, int, int]:
    """(draft, window in seconds, top) from a what-if request (POST /api/v1/whatif's body);
    Invalid naming the field else."""
    if not isinstance(data, dict):
        raise invalid("", "the body must be a JSON object")
    for name in data:
        if name not in REQUEST_FIELDS:
            raise invalid(name, f"unknown field (known: {', '.join(REQUEST_FIELDS)})")
    if "policy" not in data:
        raise invalid("policy", "this field is required: a policy document, whole or partial ({} for none)")
    window = parse_window(data.get("window", "1h"))
    top = data.get("top", TOP_TENANTS)
    if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= MAX_TOP_TENANTS:
        raise invalid("top", f"must be a whole number from 1 to {MAX_TOP_TENANTS}")
    return data["policy"], window, top


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
            if not any(out[name].values()):
                # Whether a draft empties a tier depends on the levels stored: a conflict (409).
                raise PolicyConflict("a tier needs at least one rule: the draft leaves it none", f"tiers.{name}")
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
    Raises ConfigError naming the draft's bad field, Invalid past the caps; writes nothing."""
    check_draft_size(draft)
    current = read_policy()
    merged = merge_draft(export_policy(), draft)
    return current, document_policy(check_document(merged), current.version)


def check_draft_size(draft: Any) -> None:
    """A draft names at most LIMITER_WHATIF_MAX_TENANTS tenants and LIMITER_WHATIF_MAX_RULES
    rules (tiers', tenants' overrides and global, together): Invalid naming the cap."""
    if not isinstance(draft, Mapping):
        return  # refused for its shape by merge_draft, as loadpolicies refuses it
    tenants = draft.get("tenants")
    tenants = tenants if isinstance(tenants, Mapping) else {}
    most = settings.LIMITER_WHATIF_MAX_TENANTS
    if len(tenants) > most:
        raise invalid(
            "policy.tenants",
            f"a draft names at most {most:,} tenants (LIMITER_WHATIF_MAX_TENANTS), got {len(tenants):,}",
        )
    owners = [*_values(draft.get("tiers")), *(_get(spec, "overrides") for spec in tenants.values())]
    rules = _count_rules(draft.get("global")) + sum(_count_rules(owner) for owner in owners)
    most = settings.LIMITER_WHATIF_MAX_RULES
    if rules > most:
        raise invalid("policy", f"a draft holds at most {most:,} rules (LIMITER_WHATIF_MAX_RULES), got {rules:,}")


def _values(value: Any) -> list:
    return list(value.values()) if isinstance(value, Mapping) else []


def _get(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, Mapping) else None


def _count_rules(rules: Any) -> int:
    """Rules by level (a mapping of lists), or a list of rules (the global ones)."""
    if isinstance(rules, list):
        return len(rules)
    return sum(len(specs) for specs in _values(rules) if isinstance(specs, list))


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
    and under `draft`: per tenant (the `top` most newly denied), in all, and over time. The
    draft is read here; the replay runs on the pool, and this waits for it. Raises
    ConfigError for a bad draft, Busy when the pool is full."""
    current, drafted = draft_policies(draft)
    return start_replay(current, drafted, window, top, progress).result()


def start_replay(
    current: Policy,
    drafted: Policy,
    window: float,
    top: int = TOP_TENANTS,
    progress: Callable[[int, int], None] | None = None,
    runner: Callable[..., Any] | None = None,
) -> Future:
    """`replay_window` on the pool: its Future. Busy when the pool is full. `runner` stands
    in for replay_window with the same arguments (the console's job keeps its own state)."""
    return REPLAYS.submit(runner or replay_window, current, drafted, window, top, progress)


@lru_cache(maxsize=1)
def _slots() -> HierarchicalLimiter:
    """The deployment's replay slots; a slot's lease outlives the longest replay, so that a
    worker that dies holding one gives it back by itself."""
    rule = {"type": "concurrency", "limit": settings.LIMITER_WHATIF_CONCURRENCY}
    rule["lease"] = 2 * settings.LIMITER_WHATIF_SECONDS + 30
    return HierarchicalLimiter.from_config({"whatif": [rule]}, store=limiter_store())


@contextmanager
def replay_slot(wait: float) -> Iterator[None]:
    """Hold one of the deployment's replay slots while the block runs; Busy when none came
    free within `wait` seconds."""
    slots = _slots()
    deadline = time.monotonic() + wait
    while not (taken := slots.acquire(SLOT_KEYS)).allowed:
        if time.monotonic() >= deadline:
            raise Busy(
                f"{settings.LIMITER_WHATIF_CONCURRENCY} what-if replays are running, the most at once "
                "(LIMITER_WHATIF_CONCURRENCY); try again",
                retry_after=max(1.0, min(taken.retry_after, 30.0)),
            )
        time.sleep(SLOT_POLL)  # waiting for another replay to end, in the pool's thread
    try:
        yield
    finally:
        if taken.lease is not None:
            slots.release(SLOT_KEYS, taken.lease)


def replay_window(
    current: Policy,
    drafted: Policy,
    window: float,
    top: int = TOP_TENANTS,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """`what_if` once the policies are read (no database: the pool's thread runs it), the
    replay itself in a process of its own (policies/replay_child.py) once a slot is free."""
    recorder = decision_recorder()
    end = recorder.clock() if recorder is not None else time.time()
    start = end - window
    step = series_step(window)
    job = Job(current, drafted, start, end, step, TENANT_LEVEL)
    stream = recorder.stream() if recorder is not None else None
    if stream is not None:
        job = job._replace(stream=stream)  # read by the child, with every worker's records
    else:
        job = job._replace(records=recorder.records(start, end) if recorder is not None else [])
    seconds = settings.LIMITER_WHATIF_SECONDS
    with replay_slot(wait=seconds):
        try:
            result = in_child("policies.replay_child", job, seconds, progress)
        except TimedOut:
            raise invalid(
                "window",
                f"replaying it took longer than the {seconds:g} s a replay may take (LIMITER_WHATIF_SECONDS): "
                "ask for a shorter window",
            ) from None
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
            {
                "tenant": key,
                "tier_now": current.tier_of(key),
                "tier_draft": drafted.tier_of(key),
                **_counts(impact),
            }
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
