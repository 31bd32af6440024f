"""The console's alerts (policies/admin/alerts.py): bad input is a form error on its field and
nothing is saved; the secret is never shown and an empty field keeps it; the delivery log is
on the alert's page; "Send a test" posts a test delivery to a real receiver on loopback."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from policies.models import Alert, AlertDelivery, AlertFiring
from tests.receiver import Receiver

pytestmark = pytest.mark.django_db

SECRET = "console-secret-9f2"
ADD = "/admin/policies/alert/add/"


@pytest.fixture
def operator(client):
    user = get_user_model().objects.create_superuser("operator", password=None)
    client.force_login(user)
    return user


@pytest.fixture
def receiver():
    with Receiver() as receiver:
        yield receiver


def form(**changes):
    data = {
        "name": "denials",
        "kind": "denied_share",
        "threshold": "0.2",
        "window": "5m",
        "url": "https://hooks.example.com/limiter",
        "secret": SECRET,
        "format": "json",
        "enabled": "on",
    }
    return {k: v for k, v in (data | changes).items() if v is not None}


def change_page(alert):
    return f"/admin/policies/alert/{alert.pk}/change/"


def errors_of(response):
    return {name: list(errors) for name, errors in response.context["adminform"].form.errors.items()}


def test_an_alert_is_added_from_the_console(client, operator):
    response = client.post(ADD, form())
    assert response.status_code == 302, errors_of(response)
    alert = Alert.objects.get()
    assert (alert.kind, alert.threshold, alert.window, alert.secret, alert.enabled) == (
        "denied_share",
        0.2,
        "5m",
        SECRET,
        True,
    )
    assert alert.history.get().history_user == operator


@pytest.mark.parametrize(
    "changes, field, reason",
    [
        ({"url": None}, "url", "This field is required."),
        ({"url": "ftp://files.example.com/"}, "url", "must be an http:// or https:// URL, not ftp:"),
        ({"url": "mailto:ops@example.com"}, "url", "not mailto:"),
        ({"threshold": "0"}, "threshold", "above 0 and at most 1"),
        ({"window": ""}, "window", "a denied_share alert needs a window"),
        ({"kind": "quota_used"}, "window", "only a denied_share alert has a window"),
        ({"secret": None}, "secret", "a secret is required"),
    ],
)
def test_a_bad_alert_is_a_form_error_on_its_field_and_nothing_is_saved(client, operator, changes, field, reason):
    response = client.post(ADD, form(**changes))
    assert response.status_code == 200
    errors = errors_of(response)
    assert field in errors and reason in " ".join(errors[field]), errors
    assert not Alert.objects.exists()


def test_the_secret_is_never_shown_and_an_empty_field_keeps_it(client, operator):
    client.post(ADD, form())
    alert = Alert.objects.get()
    page = client.get(change_page(alert))
    assert SECRET.encode() not in page.content
    response = client.post(change_page(alert), form(secret="", threshold="0.3", opened_version="1"))
    assert response.status_code == 302, errors_of(response)
    alert.refresh_from_db()
    assert (alert.threshold, alert.secret, alert.version) == (0.3, SECRET, 2)
    client.post(change_page(alert), form(secret="rotated", opened_version="2"))
    alert.refresh_from_db()
    assert alert.secret == "rotated"
    history = client.get(f"/admin/policies/alert/{alert.pk}/history/")
    assert b"rotated" not in history.content and SECRET.encode() not in history.content


def test_a_stale_page_is_refused(client, operator):
    client.post(ADD, form())
    alert = Alert.objects.get()
    client.post(change_page(alert), form(threshold="0.3", opened_version="1"))
    response = client.post(change_page(alert), form(threshold="0.4", opened_version="1"))
    assert "changed since you opened it" in response.content.decode()
    alert.refresh_from_db()
    assert alert.threshold == 0.3


def test_the_delivery_log_is_on_the_alerts_page(client, operator):
    client.post(ADD, form(kind="quota_used", window="", threshold="0.9"))
    alert = Alert.objects.get()
    firing = AlertFiring.objects.create(
        alert=alert,
        tenant="acme",
        level="team",
        rule="quota(1000/day)",
        threshold=0.9,
        period_start=0,
        value=0.93,
        at="2026-06-01T10:00Z",
        body="{}",
    )
    AlertDelivery.objects.create(
        alert=alert, firing=firing, attempt=1, at="2026-06-01T10:00Z", error="HTTP 500 Internal Server Error"
    )
    AlertDelivery.objects.create(alert=alert, firing=firing, attempt=2, at="2026-06-01T10:00:05Z", status=200, ok=True)
    page = client.get(change_page(alert)).content.decode()
    assert "Delivery log" in page
    assert "acme: team: quota(1000/day) at 93%" in page
    assert "delivered (200)" in page and "failed (no answer)" in page and "HTTP 500 Internal Server Error" in page
    assert page.index("2026-06-01 10:00:05") < page.index("2026-06-01 10:00:00")  # newest first
    listed = client.get("/admin/policies/alert/").content.decode()
    assert "delivered (200)" in listed and "90%" in listed


def test_send_a_test_posts_to_the_receiver_and_says_how_it_went(client, operator, receiver):
    client.post(ADD, form(url=receiver.url))
    alert = Alert.objects.get()
    response = client.post(f"/admin/policies/alert/{alert.pk}/test/", follow=True)
    assert response.redirect_chain[-1][0] == change_page(alert)
    page = response.content.decode()
    assert "Test delivered" in page and "answered 200" in page
    assert receiver.wait_for(1)[0].json()["test"] is True
    assert AlertDelivery.objects.get().test
    receiver.statuses = [500]
    page = client.post(f"/admin/policies/alert/{alert.pk}/test/", follow=True).content.decode()
    assert "Test not delivered: HTTP 500 Internal Server Error" in page


def test_send_a_test_is_a_post(client, operator, receiver):
    client.post(ADD, form(url=receiver.url))
    alert = Alert.objects.get()
    response = client.get(f"/admin/policies/alert/{alert.pk}/test/")
    assert (response.status_code, response["Location"]) == (302, change_page(alert))
    assert not receiver.requests and not AlertDelivery.objects.exists()
    assert client.post("/admin/policies/alert/999/test/").status_code == 404
