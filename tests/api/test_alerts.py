"""/api/v1/alerts: CRUD as the other policy resources (the version, 409s, strict fields), the
secret written and never read, bad input a 400 naming the field with nothing saved, the
delivery log newest first, and a test delivery to a real receiver on loopback."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from policies.models import Alert, AlertDelivery, AlertFiring
from policies.signals import current_version
from tests.receiver import Receiver

from .conftest import token_client
from .test_crud import error_of

SECRET = "whsec-0123456789"
SHARE = {"name": "denials", "kind": "denied_share", "threshold": 0.2, "window": "5m", "url": "https://x.io/h"}
QUOTA = {"name": "quota-80", "kind": "quota_used", "threshold": 0.8, "url": "https://x.io/q", "format": "slack"}


@pytest.fixture
def client(memory_engine, load, policy_doc, admin_api_client):
    load(policy_doc)
    return admin_api_client


def create(client, body, status=201):
    response = client.post("/api/v1/alerts", body, format="json")
    assert response.status_code == status, response.content
    return response


@pytest.fixture
def receiver():
    with Receiver() as receiver:
        yield receiver


# --- CRUD ---------------------------------------------------------------------------------------


def test_an_alert_is_created_read_and_listed_without_its_secret(client):
    before = current_version()
    response = create(client, {**SHARE, "secret": SECRET})
    assert response["Location"] == "/api/v1/alerts/denials"
    expected = {**SHARE, "format": "json", "enabled": True, "version": 1}
    assert response.json() == expected
    create(client, {**QUOTA, "secret": SECRET})
    assert client.get("/api/v1/alerts/denials").json() == expected
    listed = client.get("/api/v1/alerts").json()
    assert [alert["name"] for alert in listed["results"]] == ["denials", "quota-80"]
    assert listed["results"][1]["window"] is None
    assert SECRET not in str(listed) and "secret" not in listed["results"][0]
    assert Alert.objects.get(name="denials").secret == SECRET
    assert current_version() > before  # an alert is part of the policy: its changes are versions


def test_put_replaces_all_but_the_secret_and_patch_changes_what_it_sends(client):
    create(client, {**SHARE, "secret": SECRET})
    put = {**SHARE, "threshold": 0.5, "window": "1h", "format": "slack", "enabled": False, "version": 1}
    response = client.put("/api/v1/alerts/denials", put, format="json")
    assert response.status_code == 200, response.content
    assert response.json() == {**put, "version": 2}
    assert Alert.objects.get().secret == SECRET  # kept: a PUT cannot send what it never read
    response = client.patch("/api/v1/alerts/denials", {"secret": "rotated", "version": 2}, format="json")
    assert response.status_code == 200, response.content
    assert Alert.objects.get().secret == "rotated"
    response = client.patch(
        "/api/v1/alerts/denials", {"kind": "quota_used", "window": None, "version": 3}, format="json"
    )
    assert response.json()["kind"] == "quota_used" and response.json()["window"] is None


def test_a_stale_version_and_a_name_taken_are_409s(client):
    create(client, {**SHARE, "secret": SECRET})
    error = error_of(client.patch("/api/v1/alerts/denials", {"threshold": 0.3, "version": 7}, format="json"), 409)
    assert error["fields"] == {"version": error["fields"]["version"]} and "changed since" in error["message"]
    error = error_of(client.post("/api/v1/alerts", {**SHARE, "secret": SECRET}, format="json"), 409)
    assert error["fields"] == {"name": "alert 'denials' already exists"}


def test_an_alert_is_deleted_with_its_log(client):
    create(client, {**SHARE, "secret": SECRET})
    alert = Alert.objects.get()
    firing = AlertFiring.objects.create(
        alert=alert, tenant="acme", threshold=0.2, period_start=0, value=0.5, at="2026-06-01T00:00Z", body="{}"
    )
    AlertDelivery.objects.create(alert=alert, firing=firing, at="2026-06-01T00:00Z", status=200, ok=True)
    assert client.delete("/api/v1/alerts/denials").status_code == 204
    assert not Alert.objects.exists() and not AlertFiring.objects.exists() and not AlertDelivery.objects.exists()
    error = error_of(client.get("/api/v1/alerts/denials"), 404)
    assert error["fields"] == {"name": "no alert 'denials'"}


# --- bad input: a 400 naming the field, nothing saved --------------------------------------------


@pytest.mark.parametrize(
    "change, field, reason",
    [
        ({"url": None}, "url", "This field is required."),
        ({"url": "ftp://files.example.com/x"}, "url", "must be an http:// or https:// URL, not ftp:"),
        ({"url": "file:///etc/passwd"}, "url", "must be an http:// or https:// URL, not file:"),
        ({"url": "gopher://x"}, "url", "not gopher:"),
        ({"url": "https://"}, "url", "must name a host"),
        ({"threshold": 0}, "threshold", "above 0 and at most 1"),
        ({"threshold": 1.01}, "threshold", "above 0 and at most 1"),
        ({"threshold": "0.8"}, "threshold", "A valid number is required."),
        ({"window": None}, "window", "a denied_share alert needs a window"),
        ({"window": "30s"}, "window", "from 1m to 24h"),
        ({"kind": "quota_used"}, "window", "only a denied_share alert has a window"),
        ({"kind": "errors"}, "kind", "is not a valid choice"),
        ({"format": "teams"}, "format", "is not a valid choice"),
        ({"secret": None}, "secret", "This field is required."),
        ({"secret": ""}, "secret", "This field may not be blank."),
        ({"enabled": "yes"}, "enabled", "Must be a valid boolean."),
        ({"name": "two words"}, "name", "Letters, digits and _ . : - only."),
        ({"version": 1}, "version", "read-only"),
        ({"kyes": 1}, "kyes", "unknown field"),
    ],
)
def test_a_bad_alert_is_a_400_naming_its_field_and_nothing_is_saved(client, change, field, reason):
    body = {key: value for key, value in ({**SHARE, "secret": SECRET} | change).items() if value is not None}
    error = error_of(client.post("/api/v1/alerts", body, format="json"), 400)
    assert set(error["fields"]) == {field}, error
    assert reason in error["fields"][field]
    assert not Alert.objects.exists()


def test_a_bad_change_saves_nothing(client):
    create(client, {**SHARE, "secret": SECRET})
    error = error_of(client.patch("/api/v1/alerts/denials", {"url": "ftp://x", "version": 1}, format="json"), 400)
    assert set(error["fields"]) == {"url"}
    alert = Alert.objects.get()
    assert (alert.url, alert.version) == ("https://x.io/h", 1)


def test_a_decide_token_may_not_read_alerts(client, decide_client):
    assert decide_client.get("/api/v1/alerts").status_code == 403
    assert token_client("la_nope_nope").get("/api/v1/alerts").status_code == 401


# --- the log and the test send -------------------------------------------------------------------


def test_a_test_delivery_is_sent_signed_and_answered_as_the_log_keeps_it(client, receiver):
    create(client, {**SHARE, "url": receiver.url, "secret": SECRET})
    response = client.post("/api/v1/alerts/denials/test")
    assert response.status_code == 200, response.content
    answer = response.json()
    assert {k: answer[k] for k in ("attempt", "ok", "status", "error", "test", "firing")} == {
        "attempt": 1,
        "ok": True,
        "status": 200,
        "error": "",
        "test": True,
        "firing": None,
    }
    [request] = receiver.wait_for(1)
    expected = "sha256=" + hmac.new(SECRET.encode(), request.body, hashlib.sha256).hexdigest()
    assert request.headers["X-Limiter-Signature"] == expected
    assert request.json()["test"] is True
    assert client.get("/api/v1/alerts/denials/deliveries").json()["results"] == [answer]


def test_a_receiver_that_fails_is_a_200_that_says_so(client, receiver):
    create(client, {**SHARE, "url": receiver.url, "secret": SECRET})
    receiver.statuses = [502]
    answer = client.post("/api/v1/alerts/denials/test", {}, format="json").json()
    refused = (False, 502, "HTTP 502 Bad Gateway: the receiver is down")
    assert (answer["ok"], answer["status"], answer["error"]) == refused


def test_the_delivery_log_is_newest_first_with_what_fired(client):
    create(client, {**QUOTA, "secret": SECRET})
    alert = Alert.objects.get()
    firing = AlertFiring.objects.create(
        alert=alert,
        tenant="acme",
        level="team",
        rule="quota(1000/day)",
        threshold=0.8,
        period_start=1764547200,
        resets_at=1764633600,
        value=0.81,
        at="2026-06-01T10:00Z",
        body="{}",
        attempts=2,
        state="delivered",
    )
    AlertDelivery.objects.create(alert=alert, firing=firing, attempt=1, at="2026-06-01T10:00Z", error="HTTP 500")
    AlertDelivery.objects.create(
        alert=alert, firing=firing, attempt=2, at="2026-06-01T10:00:05Z", status=200, ok=True, duration=0.01
    )
    log = client.get("/api/v1/alerts/quota-80/deliveries").json()
    assert log["count"] == 2
    newest, oldest = log["results"]
    assert (newest["attempt"], newest["ok"], newest["at"]) == (2, True, "2026-06-01T10:00:05Z")
    assert (oldest["attempt"], oldest["status"], oldest["error"]) == (1, None, "HTTP 500")
    assert newest["firing"] == {
        "tenant": "acme",
        "level": "team",
        "rule": "quota(1000/day)",
        "threshold": 0.8,
        "value": 0.81,
        "period_start": 1764547200,
        "resets_at": 1764633600,
        "state": "delivered",
        "attempts": 2,
    }
    assert client.get("/api/v1/alerts/quota-80/deliveries?limit=1").json()["results"] == [newest]


def test_the_log_and_the_test_of_an_unknown_alert_are_404s(client):
    assert error_of(client.get("/api/v1/alerts/nope/deliveries"), 404)["fields"] == {"name": "no alert 'nope'"}
    assert error_of(client.post("/api/v1/alerts/nope/test"), 404)["fields"] == {"name": "no alert 'nope'"}


def test_a_test_send_takes_no_body(client):
    create(client, {**SHARE, "secret": SECRET})
    error = error_of(client.post("/api/v1/alerts/denials/test", {"tenant": "acme"}, format="json"), 400)
    assert "takes no body" in error["message"]
    assert not AlertDelivery.objects.exists()
