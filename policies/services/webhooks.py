"""What an alert sends, and how: the body (JSON, or Slack's incoming-webhook form), its
signature, and one POST to the receiver with a timeout.

    body = alert_body(fired, now)                     # bytes, sent as they are by every attempt
    X-Limiter-Signature: sha256=<hex>                 # HMAC-SHA256 of those bytes under the secret
    attempt = post(url, body, secret, timeout=5.0)    # Attempt(status, ok, error, duration)

The receiver verifies the signature over the exact bytes it received (docs/API.md, "Alerts").
Redirects are not followed (a 3xx is a failed attempt): the body and its signature go to the
URL the operator set, nowhere else.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import http.client
import json
import time
import urllib.error
import urllib.request
from typing import Any, NamedTuple

SIGNATURE_HEADER = "X-Limiter-Signature"
DELIVERY_HEADER = "X-Limiter-Delivery"
USER_AGENT = "limiter-admin-alerts/1"
MAX_ERROR = 500
READ_AT_MOST = 1024  # of the receiver's answer: enough to say why it refused


class Fired(NamedTuple):
    """What an alert's body says: which alert, for whom, what passed which threshold when."""

    alert: str
    kind: str
    tenant: str | None
    level: str | None
    rule: str | None
    threshold: float
    value: float | None
    period_start: int | None
    resets_at: int | None
    window: str = ""
    test: bool = False


class Attempt(NamedTuple):
    """One POST: the receiver's HTTP status (None: it never answered), whether it took the
    delivery (a 2xx), why not, and how long it took in seconds."""

    status: int | None
    ok: bool
    error: str
    duration: float


def alert_body(fired: Fired, now: float, format: str = "json") -> bytes:
    """The body every attempt of a delivery sends, byte for byte."""
    if format == "slack":
        return json.dumps({"text": slack_text(fired, now)}).encode()
    fields = {
        "alert": fired.alert,
        "kind": fired.kind,
        "tenant": fired.tenant,
        "level": fired.level,
        "rule": fired.rule,
        "threshold": fired.threshold,
        "value": None if fired.value is None else round(fired.value, 6),
        "period_start": fired.period_start,
        "resets_at": fired.resets_at,
        "at": round(now, 3),
        "test": fired.test,
    }
    return json.dumps(fields).encode()


def slack_text(fired: Fired, now: float) -> str:
    """One line for a chat channel (Slack's incoming webhooks, Mattermost, Rocket.Chat)."""
    head = f"Limiter alert *{fired.alert}*"
    if fired.test:
        return f"{head}: a test delivery ({fired.kind}, threshold {percent(fired.threshold)}), sent {utc(now)}."
    value = percent(fired.value or 0.0)
    if fired.kind == "denied_share":
        return (
            f"{head}: tenant `{fired.tenant}` had {value} of its decisions denied over the last "
            f"{fired.window} (threshold {percent(fired.threshold)}), at {utc(now)}."
        )
    period = f" The period started {utc(fired.period_start)}." if fired.period_start is not None else ""
    resets = f" It resets {utc(fired.resets_at)}." if fired.resets_at is not None else " It does not reset by itself."
    return (
        f"{head}: tenant `{fired.tenant}` has used {value} of its {fired.level} quota {fired.rule} "
        f"(threshold {percent(fired.threshold)}).{period}{resets}"
    )


def percent(share: float) -> str:
    return f"{share * 100:.4g}%"


def utc(epoch: float) -> str:
    return f"{dt.datetime.fromtimestamp(epoch, dt.UTC):%Y-%m-%d %H:%M:%S} UTC"


def signature(body: bytes, secret: str) -> str:
    """`sha256=<hex>`: HMAC-SHA256 of `body` under `secret`, as X-Limiter-Signature says it."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises the 3xx as an HTTPError: a failed attempt


_OPENER = urllib.request.build_opener(_NoRedirects)


def post(url: str, body: bytes, secret: str, timeout: float, delivery: str = "") -> Attempt:
    """POST `body` to `url`, signed under `secret`, waiting at most `timeout` seconds to
    connect and for each read. Never raises: a failure is an Attempt that says why."""
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        SIGNATURE_HEADER: signature(body, secret),
    }
    if delivery:
        headers[DELIVERY_HEADER] = delivery
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    started = time.monotonic()  # how long it took, as measured: no clock to inject here
    status: int | None = None
    error = ""
    try:
        with _OPENER.open(request, timeout=timeout) as answer:
            status = answer.status
            answer.read(READ_AT_MOST)
    except urllib.error.HTTPError as refused:
        status = refused.code
        error = f"HTTP {refused.code} {refused.reason}: {_said(refused)}".rstrip(": ")
    except urllib.error.URLError as failed:
        error = f"{type(failed.reason).__name__}: {failed.reason}"
    except (OSError, http.client.HTTPException, ValueError) as failed:
        error = f"{type(failed).__name__}: {failed}"
    ok = status is not None and 200 <= status < 300
    if status is not None and not ok and not error:
        error = f"HTTP {status}"
    return Attempt(status, ok, error[:MAX_ERROR], time.monotonic() - started)


def _said(refused: urllib.error.HTTPError) -> str:
    try:
        return refused.read(READ_AT_MOST).decode("utf-8", "replace").strip()
    except (OSError, http.client.HTTPException):
        return ""
