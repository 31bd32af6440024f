"""The REST API (v1) as its clients read it, once for the synchronous `LimiterClient` and the
asyncio `AsyncLimiterClient` (both imported from core.client): the errors, the request bodies,
a decision from JSON, an error from an answer, the wait between two tries, and what a
reservation's answer holds. Transport-free: no socket, no event loop.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlsplit

from .decision import OK, Decision
from .errors import LimiterError

API_PREFIX = "/api/v1"
# A denial that says "retry now" (it should not happen) is retried after this, not at once.
MIN_WAIT = 0.01
USER_AGENT = "limiter-admin-client/1"
# The answers to a settlement that mean "not open any more": unknown or expired (404), settled
# already (409). A release answers 404 alone for a slot not held (released, run out, unknown).
GONE = (404, 409)
NOT_HELD = 404


class LimiterAPIError(LimiterError):
    """The API answered with an error: `code` and `message` from its error shape, `fields`
    mapping request fields to what is wrong with them, `status` the HTTP status."""

    def __init__(
        self, code: str, message: str, fields: Mapping[str, str] | None = None, status: int | None = None
    ) -> None:
        self.code, self.message, self.fields, self.status = code, message, dict(fields or {}), status
        super().__init__(f"{status} {code}: {message}" if status else f"{code}: {message}")


class LimiterUnavailable(LimiterError):
    """The API could not be reached, or did not answer within the client's timeout."""


class RateLimited(LimiterError):
    """A reservation was denied; `decision` has the wait (`retry_after`) and `blocked_by`."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        wait = "never fits" if math.isinf(decision.retry_after) else f"retry after {decision.retry_after:g} s"
        super().__init__(f"rate limited by {decision.blocked_by} ({decision.reason}): {wait}")


# Where the API is -----------------------------------------------------------------------------


class Endpoint:
    """A base URL, checked: its scheme, host, port and the path the API's paths go under."""

    def __init__(self, base_url: str) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"base_url must be an http:// or https:// URL, got {base_url!r}")
        self.url, self.https, self.host = base_url, url.scheme == "https", url.hostname
        self.port = url.port or (443 if self.https else 80)
        self.explicit_port = url.port
        self.prefix = url.path.rstrip("/") + API_PREFIX

    def headers(self, token: str) -> dict[str, str]:
        """The header fields of every request: the token, JSON both ways."""
        return {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        }


# What is sent -------------------------------------------------------------------------------


def encode(body: Mapping[str, Any]) -> bytes:
    """A request body as JSON; a NaN or an infinity is a ValueError here, not a 400 later."""
    return json.dumps(body, allow_nan=False).encode()


def decide_body(keys: Mapping[str, str], cost: float, priority: str | None, dry_run: bool) -> dict:
    return {"keys": dict(keys), "cost": cost, "priority": priority, "dry_run": dry_run}


def batch_body(requests: Iterable[Mapping[str, Any]]) -> dict:
    return {"requests": [dict(r) for r in requests]}


def reservation_body(keys: Mapping[str, str], cost: float, priority: str | None, hold: float | None) -> dict:
    body: dict[str, Any] = {"keys": dict(keys), "cost": cost, "priority": priority}
    if hold is not None:
        body["hold"] = hold
    return body


def release_path(lease: str) -> str:
    return f"/leases/{quote(lease, safe='')}/release"


def settle_path(reservation_id: str, action: str) -> str:
    return f"/reservations/{quote(reservation_id, safe='')}/{action}"


# What comes back ----------------------------------------------------------------------------


def read_answer(status: int, reason: str, raw: bytes) -> Any:
    """The parsed JSON of a 2xx answer (None when it is empty or no JSON); LimiterAPIError for
    any other status, from the error shape `{"error": {"code", "message", "fields"}}`, or
    `http_<status>` with the start of the body when the answer has another shape (a proxy's
    502 page)."""
    try:
        data = json.loads(raw) if raw else None
    except ValueError:
        data = None
    if 200 <= status < 300:
        return data
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        fields = error.get("fields") if isinstance(error.get("fields"), dict) else {}
        raise LimiterAPIError(error["code"], str(error.get("message", "")), fields, status)
    text = raw[:200].decode("utf-8", "replace").strip() or reason
    raise LimiterAPIError(f"http_{status}", text, {}, status)


def decision_from_json(data: Any, status: int | None = None) -> Decision:
    """A Decision from the API's JSON; null `retry_after` and `remaining` are math.inf."""
    if not isinstance(data, dict) or not isinstance(data.get("allowed"), bool):
        raise LimiterAPIError("bad_response", f"not a decision: {str(data)[:200]}", status=status)
    retry_after, remaining = data.get("retry_after", 0.0), data.get("remaining")
    return Decision(
        allowed=data["allowed"],
        retry_after=math.inf if retry_after is None else float(retry_after),
        blocked_by=data.get("blocked_by"),
        reason=data.get("reason") or OK,
        remaining=math.inf if remaining is None else float(remaining),
        degraded=bool(data.get("degraded", False)),
        lease=data.get("lease"),
        shadow_blocked=tuple(data.get("shadow_blocked") or ()),
        over_quota=tuple(data.get("over_quota") or ()),
    )


def decisions_from_json(data: Any, status: int | None = None) -> list[Decision]:
    """The decisions of a batch's answer, in order."""
    decisions = data.get("decisions") if isinstance(data, dict) else None
    if not isinstance(decisions, list):
        raise LimiterAPIError("bad_response", f"no decisions in {str(data)[:200]}", status=status)
    return [decision_from_json(item, status) for item in decisions]


def next_wait(decision: Decision, now: float, deadline: float) -> float | None:
    """How long `acquire` sleeps before asking again after `decision`: its `retry_after` (at
    least MIN_WAIT); None to stop here: allowed, or a wait that never ends, or one that would
    end past `deadline` (so a waiter never sleeps past it)."""
    if decision.allowed:
        return None
    wait = max(decision.retry_after, MIN_WAIT)
    if math.isinf(wait) or now + wait > deadline:
        return None
    return wait


def deadline_of(now: float, timeout: float | None) -> float:
    """`timeout` seconds from `now`; None waits as long as it takes."""
    return math.inf if timeout is None else now + max(0.0, timeout)


class ReservationAnswer:
    """What POST /reservations answered: the decision, the reservation's `id` (None when the
    API allowed without a reservation: a fail mode decided while its store was down; there is
    nothing to settle then), `expires_at`, and the state of its settlement. The clients'
    reservations add commit and cancel."""

    def __init__(self, body: Any, cost: float, status: int) -> None:
        body = body if isinstance(body, dict) else {}
        self.decision = decision_from_json(body, status)
        self.allowed = self.decision.allowed
        self.id: str | None = body.get("id")
        self.expires_at = parse_time(body.get("expires_at"))
        self.cost = cost
        self.actual_cost: float | None = None
        self.settlement: dict | None = None  # the server's answer to commit or cancel
        self.settled = self.id is None

    def commit_body(self, actual_cost: float | None) -> dict:
        """The body of a commit: `actual_cost` if given, else the one set on the reservation,
        else the reserved cost."""
        if actual_cost is None:
            actual_cost = self.actual_cost if self.actual_cost is not None else self.cost
        return {"actual_cost": actual_cost}

    def settle_failed(self, error: LimiterAPIError) -> None:
        """A settlement was refused: the reservation is not open any more when the server
        says it is gone (expired, or settled already)."""
        if error.status in GONE:
            self.settled = True

    def __repr__(self) -> str:
        state = "settled" if self.settled else f"open until {self.expires_at}"
        return f"<{type(self).__name__} {self.id} cost={self.cost!r} {state}>"


def parse_time(value: Any) -> datetime | None:
    """ISO 8601 (a trailing Z included) to an aware datetime; None when absent."""
    if not isinstance(value, str):
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
