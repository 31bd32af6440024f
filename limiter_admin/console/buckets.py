"""One key on the dashboard: its live buckets, a dry run of a request for it, and a reset.

The numbers are the services' own: `bucket_report` (what GET /api/v1/buckets answers),
`explain` (a dry run of POST /api/v1/decisions, which takes nothing) and
`tenant_limits.reset_buckets`. A key's buckets are a few per-key reads of the store.
"""

from __future__ import annotations

import json

from core import InvalidRequest, StoreUnavailable
from limiter_admin.actions import log_console_action
from policies.models import Tenant, Tier
from policies.services import tenant_limits
from policies.services.answers import decision_body, explain_rows
from policies.services.decisions import explain
from policies.services.errors import ServiceError
from policies.services.inspection import bucket_report

from .formatting import change_url, duration, key_name, local_time, two_decimals
from .forms import BucketQuery, DryRunQuery


def bucket_context(query: BucketQuery, policy) -> dict:
    """What GET /api/v1/buckets says about the key, ready to show; form errors otherwise."""
    context = {"form": query}
    if not query.is_bound or not query.is_valid():
        return context
    data = query.cleaned_data
    try:
        report = bucket_report(data["level"], data["key"], data.get("team") or None)
    except ServiceError as error:
        query.add_api_error(error)
        return context
    except StoreUnavailable as error:
        return {**context, "query": query.query(), "unavailable": str(error)}
    tenant = policy.tenants.get(report["tenant"]) if report["tenant"] else None
    return {
        **context,
        "query": query.query(),
        "report": report,
        "rules": [_rule_row(rule) for rule in report["rules"]],
        "tenant_url": change_url("tenant", _pk(Tenant, key=report["tenant"])),
        "tier_url": change_url("tier", _pk(Tier, name=report["tier"])),
        "overrides_until": local_time(tenant.until) if tenant and tenant.until and report["override"] else None,
    }


# Where a rule's state shows how much is used (slots, a window, a quota), the meter is drawn
# as use: empty is good and full is the warning. A bucket's tokens are room: full is good.
WARN_SHARE = 0.8


def _rule_row(rule: dict) -> dict:
    """One rule's live state, as the operator reads it: what is left of how much (a bucket),
    or how much of it is used (slots, a window, a quota), and whether that is a warning."""
    state = rule["state"]
    if "tokens" in state:
        value, most, what, room = state["tokens"], state.get("capacity"), "tokens left", True
    elif "in_flight" in state:
        value, most, what, room = state["in_flight"], state.get("limit"), "slots in use", False
    elif "used" in state:
        what = "used this period" if "period" in state else "used in the window"
        value, most, room = state["used"], state.get("limit"), False
    else:
        value, most, what, room = state.get("remaining"), None, "remaining", True
    left = (value if room else most - value) if most is not None and value is not None else None
    full = left is not None and left <= 0
    return {
        **rule,
        "what": what,
        "value": two_decimals(value),
        "most": most,
        "room": room,
        # <meter>'s own regions: the browser draws a value past `high` (use) or below `low`
        # (room) in its warning colour.
        "meter": _meter(most, room) if most else None,
        "warning": most is not None and value is not None and (left <= (1 - WARN_SHARE) * most),
        "note": _full_note(rule, state, full, room),
        "full_in": _again(state, room),
        "debt": _debt(state),
    }


def _meter(most: float, room: bool) -> dict:
    """<meter>'s regions: one bound at the warning share, the optimum at full room or no use."""
    bound = round((1 - WARN_SHARE) * most if room else WARN_SHARE * most, 6)
    return {"low": bound, "high": bound, "optimum": most if room else 0}


def _full_note(rule: dict, state: dict, full: bool, room: bool) -> str | None:
    """A word where the bar alone would mislead: every slot in use, a window or quota used up."""
    if not full:
        return None
    if "in_flight" in state:
        return "all slots in use"
    if "period" in state:
        return "quota spent"
    return None if room else "window used up"


def _again(state: dict, room: bool) -> str:
    """When the rule has all its room again: a bucket full, every slot free, a window empty;
    a quota only when its period ends."""
    if "period" in state:
        resets = state.get("resets_at")
        return (
            "never (credits: a top-up refills them)"
            if resets is None
            else f"resets at {local_time(resets):%Y-%m-%d %H:%M %Z}"
        )
    if room:
        return duration(state.get("full_in"), never="never (does not refill)", zero="full now")
    what = "all slots free" if "in_flight" in state else "the window empty"
    return duration(state.get("full_in"), never="never", zero=f"{what} now")


def _debt(state: dict) -> str | None:
    """For a bucket below zero (a settled charge above its estimate): when it is back above."""
    clears_in = state.get("debt_clears_in", 0.0)  # null in JSON: it never refills
    if clears_in == 0.0:
        return None
    return f"in debt: back above zero in {duration(clears_in)}" if clears_in else "in debt for good (never refills)"


def _pk(model, **lookup):
    """The primary key of the row that `lookup` finds, for a link to its admin page; None if
    there is none or a lookup value is None."""
    if any(value is None for value in lookup.values()):
        return None
    return model.objects.filter(**lookup).values_list("pk", flat=True).first()


# Reset ----------------------------------------------------------------------------------


def shown_rules(query: BucketQuery) -> str:
    """The rules a reset of this key acts on, as a JSON list: the confirmation page carries
    them, and the reset goes ahead only if they are still the key's rules."""
    return json.dumps(tenant_limits.key_rules(query.cleaned_data["level"], query.team_key))


def reset_buckets(request, query: BucketQuery) -> str:
    """Forget the state of every rule of the key (it starts full), and log who did it.
    Returns the key as the console names it."""
    data = query.cleaned_data
    tenant_limits.reset_buckets(data["level"], data["key"], query.team_key)
    # The admin's own log, so the reset shows in the operator's "Recent actions", attached to
    # the tenant of the key's team when it has one (the entry links to its page).
    team = query.team_key
    tenant = Tenant.objects.filter(key=team).first() if team is not None else None
    what = key_name(data["level"], data["key"], data.get("team"))
    log_console_action(request, f"reset the buckets of {what}", what, tenant)
    return what


# Dry run ---------------------------------------------------------------------------------


def dry_run_context(query: DryRunQuery) -> dict:
    """The decision a request for this key would get now, and each rule's wait; takes nothing."""
    context = {"form": query}
    if not query.is_valid():
        return context
    data = query.cleaned_data
    try:
        decision, rows = explain_key(data["level"], data["key"], data["cost"], data["priority"] or None, query.team_key)
    except InvalidRequest as error:
        query.add_api_error(error)
        return context
    except StoreUnavailable as error:
        return {**context, "unavailable": str(error)}
    body = decision_body(decision)
    return {
        **context,
        "decision": {**body, "remaining": two_decimals(body["remaining"])},
        "retry_after": duration(body["retry_after"], never="never: the cost exceeds a limit", zero="now"),
        "rules": [
            {
                **row,
                "remaining": two_decimals(row["remaining"]),
                "wait_text": duration(row["wait"], never="never", zero="none"),
            }
            for row in explain_rows(rows)
        ],
    }


def explain_key(level: str, key: str, cost: float, priority: str | None, team: str | None):
    """The dry run of one key alone (policies.services.decisions.explain): (decision, rows)."""
    explained = explain({level: key}, cost, priority, team=team)
    return explained.decision, explained.rows or []
