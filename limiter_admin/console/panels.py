"""The dashboard's overview: who is throttled by what, whether the limiter is healthy, and
the suggestions of its search box.

Every number comes from the services behind the REST read-outs, never worked out again
here: the denial statistics behind GET /api/v1/stats/blocked (`blocked_report`), the
store's health, and the users seen recently. Nothing scans the store's keys: a panel is the
statistics report and a few database reads, however many keys the store holds.
"""

from __future__ import annotations

import time

from core import StoreUnavailable
from policies.compile import policy_cache
from policies.models import Level, PriorityClass, Tenant
from policies.policy import TENANT_LEVEL
from policies.services.health import store_health
from policies.services.inputs import MAX_KEY_LENGTH
from policies.services.usage import blocked_report, parse_window, seen_users

from .formatting import bucket_url, change_url, duration, local_time, percent, rule_colour, tenant_url, three_figures
from .quotas import near_quota_context

# The windows an operator picks from: label, and the chart's step (seconds per bar).
WINDOWS = {"5m": ("5 min", 60), "1h": ("1 h", 60), "24h": ("24 h", 900)}
DEFAULT_WINDOW = "1h"
TOP = 10  # most throttled keys shown per level
MAX_SERIES = 8  # blocked_by rules drawn one by one; the rest are drawn as one "other"
OTHER_COLOUR = "hsl(0, 0%, 60%)"
SEARCH_RESULTS = 8  # suggestions of each kind
FAIL_MODE_MEANING = {
    "open": "allows every request",
    "closed": "denies every request (retry after about 1 s)",
    "local": "limits in each process at {fraction:.0%} of the rules",
}


def window_name(name: str | None) -> str:
    """The window an operator asked for, if it is one of WINDOWS; else the default."""
    return name if name in WINDOWS else DEFAULT_WINDOW


# Who is throttled, by what ---------------------------------------------------------------


def denial_reports(windows) -> dict[str, dict | str]:
    """The denial statistics of each window: its report, or why it cannot be read.

    This is what GET /api/v1/stats/blocked answers (`blocked_report`), asked with a `step`
    so that a 24 h chart has 96 bars rather than 1,440. Each window is read on its own: a
    24 h report that times out still leaves the 5 minutes and the hour to show."""
    reports: dict[str, dict | str] = {}
    for name, (_, step) in windows.items():
        try:
            reports[name] = blocked_report(parse_window(name), top=TOP, step=step)
        except StoreUnavailable as error:
            reports[name] = f"the statistics cannot be read: {error}"
    return reports


def throttled_context(reports: dict, window: str, policy) -> dict:
    """The throttled panel for `window`: totals and rules in every window, the window's chart,
    and its most throttled tenants and keys."""
    report = reports[window]
    context = {
        "window": window,
        "window_label": WINDOWS[window][0],
        "windows": [{"name": name, "label": label, "current": name == window} for name, (label, _) in WINDOWS.items()],
    }
    if isinstance(report, str):
        return {**context, "unavailable": report}
    return {
        **context,
        "totals": _totals(reports),
        # A column for decisions made in Django apps' own views, once there are any.
        "embedded": any(isinstance(report, dict) and report.get("embedded") for report in reports.values()),
        "rules": _rules_by_window(reports),
        "shadow_rules": _rules_by_window(reports, "shadow_blocked_by"),
        "chart": blocked_chart(report, WINDOWS[window][1]),
        "step_text": duration(WINDOWS[window][1]),
        "tenants": _top_tenants(report["top_tenants"], report["top_keys"]),
        "near_quota": near_quota_context(policy_cache().clock()),
        "top": _top_keys(report["top_keys"], policy.levels),
    }


def _totals(reports: dict) -> list[dict]:
    return [
        {"label": WINDOWS[name][0], "unavailable": report}
        if isinstance(report, str)
        else {
            "label": WINDOWS[name][0],
            "decisions": report["decisions"],
            "denied": report["denied"],
            "share": percent(report["denied"], report["decisions"]),
            "embedded": report["embedded"],
            "embedded_denied": report["embedded_denied"],
        }
        for name, report in reports.items()
    ]


def _rules_by_window(reports: dict, field: str = "blocked_by") -> list[dict]:
    """Each blocked_by (or shadow rule, `field="shadow_blocked_by"`) with its denials in every
    window ("n/a" where a window could not be read), most denied right now first."""
    counts: dict[str, dict[str, int]] = {}
    for name, report in reports.items():
        for row in [] if isinstance(report, str) else report[field]:
            counts.setdefault(row["blocked_by"], {})[name] = row["denied"]
    rows = [
        {
            "blocked_by": rule,
            "colour": rule_colour(rule),
            "counts": [
                by_window.get(name, 0) if isinstance(report, dict) else "n/a" for name, report in reports.items()
            ],
        }
        for rule, by_window in counts.items()
    ]
    return sorted(rows, key=lambda row: ([-n if isinstance(n, int) else 0 for n in row["counts"]], row["blocked_by"]))


def blocked_chart(report: dict, step: int) -> dict:
    """Chart.js data: one stacked series of denials per blocked_by, one bar per step."""
    series = report["series"]
    names = [row["blocked_by"] for row in report["blocked_by"]]
    shown, rest = names[:MAX_SERIES], names[MAX_SERIES:]
    datasets = [
        {"label": name, "data": [point["blocked_by"].get(name, 0) for point in series], "colour": rule_colour(name)}
        for name in shown
    ]
    if rest:
        datasets.append(
            {
                "label": f"{len(rest)} other rules",
                "data": [sum(point["blocked_by"].get(name, 0) for name in rest) for point in series],
                "colour": OTHER_COLOUR,
            }
        )
    labels = [local_time(point["at"]).strftime("%H:%M") for point in series]
    return {"labels": labels, "datasets": datasets, "step": step}


def _top_tenants(rows: list[dict], top_keys: dict) -> list[dict]:
    """The tenants with the most denials at any level, each with its page and the live buckets
    of its most denied key: a user of its own, itself, or (neither among the most denied) its
    page's breakdown of what denied it."""
    found = []
    for row in rows:
        tenant = row["tenant"]
        where = _most_denied_key(tenant, top_keys)
        if where is None:
            link, label = tenant_url(tenant) + "#tenant-blocked", "what denied it"
        else:
            level, key = where
            team = tenant if level != TENANT_LEVEL else None
            link, label = bucket_url(level, key, team), f"{level} {key}: live buckets"
        found.append({**row, "tenant_url": tenant_url(tenant), "buckets_url": link, "where": label})
    return found


def _most_denied_key(tenant: str, top_keys: dict) -> tuple[str, str] | None:
    """(level, key) of the tenant's most denied key among the most denied keys of each level:
    the tenant itself at its level, or one of its users."""
    best: tuple[int, str, str] | None = None
    for level, keys in top_keys.items():
        for row in keys:
            if (level == TENANT_LEVEL and row["key"] == tenant) or row.get("team") == tenant:
                if best is None or row["denied"] > best[0]:
                    best = (row["denied"], level, row["key"])
    return None if best is None else (best[1], best[2])


def _top_keys(top_keys: dict, levels) -> list[dict]:
    """The most throttled keys of each level below the tenants' (users as team / user), each
    with links that carry its whole key: a user's buckets are its team's tier's."""
    order = sorted((level for level in top_keys if level != TENANT_LEVEL), key=lambda level: _position(levels, level))
    return [
        {
            "level": level,
            "title": _level_title(level),
            "keys": [
                {
                    **row,
                    "buckets_url": bucket_url(level, row["key"], row.get("team")),
                    "tenant_url": tenant_url(row["team"]) if row.get("team") else None,
                }
                for row in top_keys[level]
            ],
        }
        for level in order
    ]


def _level_title(level: str) -> str:
    return {"user": "Users (team / user)"}.get(level, f"Keys at level {level}")


def _position(levels, level: str) -> int:
    return levels.index(level) if level in levels else len(levels)


# Health ------------------------------------------------------------------------------------


def health_context(policy, reports: dict) -> dict:
    """The health panel: the store, the policy's version, each level's fail mode, the priority
    classes' watermarks, and decisions and denials per second."""
    levels = dict(Level.objects.values_list("name", "pk"))
    priorities = dict(PriorityClass.objects.values_list("name", "pk"))
    return {
        "store": store_context(),
        "version": policy.version,
        "levels": [
            {
                "name": name,
                **mode,
                "meaning": _fail_mode_meaning(mode),
                "edit_url": change_url("level", levels.get(name)),
            }
            for name, mode in policy.fail_modes.items()
        ],
        "priorities": [
            {
                "name": name,
                "watermark": f"{spec['watermark']:g}",
                "percent": f"{spec['watermark'] * 100:g}",
                "levels": ", ".join(spec.get("levels", [])) or "global (default)",
                "edit_url": change_url("priorityclass", priorities.get(name)),
            }
            for name, spec in sorted(policy.priorities.items())
        ],
        "rates": [_rates(WINDOWS[name][0], report) for name, report in reports.items() if name in ("5m", "1h")],
    }


def store_context() -> dict:
    """The store's health (policies.services.health), with times as the operator reads them."""
    health = store_health()
    parts = [
        {
            **part,
            "since": local_time(part["down_since"]) if part["down_since"] is not None else None,
            "for": duration(time.time() - part["down_since"]) if part["down_since"] is not None else None,
        }
        for part in health["parts"]
    ]
    return {**health, "parts": parts}


def _fail_mode_meaning(mode: dict) -> str:
    return FAIL_MODE_MEANING.get(mode["fail_mode"], mode["fail_mode"]).format(
        fraction=mode.get("fallback_fraction") or 0
    )


def _rates(label: str, report: dict | str) -> dict:
    """Decisions and denials per second over the window, from the statistics' own counts."""
    if isinstance(report, str):
        return {"label": label, "unavailable": report}
    seconds = max(report["until"] - report["since"], 1)
    return {
        "label": label,
        "decisions": report["decisions"],
        "denied": report["denied"],
        "decision_rate": three_figures(report["decisions"] / seconds),
        "denial_rate": three_figures(report["denied"] / seconds),
        "share": percent(report["denied"], report["decisions"]),
    }


# Search -----------------------------------------------------------------------------------


def search_context(q: str) -> dict:
    """Tenants whose key starts with `q`, and users seen recently whose key does."""
    q = q[:MAX_KEY_LENGTH]
    if not q.strip():
        return {"q": q, "empty": True}
    tenants = list(Tenant.objects.filter(key__startswith=q).select_related("tier").order_by("key")[:SEARCH_RESULTS])
    context = {
        "q": q,
        "tenants": [{"key": t.key, "tier": t.tier.name, "url": tenant_url(t.key)} for t in tenants],
    }
    try:
        users = seen_users(q, SEARCH_RESULTS)
    except StoreUnavailable as error:
        return {**context, "users": [], "unavailable": str(error)}
    context["users"] = [
        {
            **user,
            "buckets_url": bucket_url("user", user["user"], user["team"]),
            "tenant_url": tenant_url(user["team"]) if user["team"] else None,
        }
        for user in users
    ]
    return context
