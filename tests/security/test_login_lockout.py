"""Login hardening (django-axes): 5 failed logins for one username from one address lock that
pair out for 15 minutes, the right password included; then it may try again. Time is moved
by moving the recorded attempts back, never by waiting."""

import datetime as dt
import io

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from rest_framework.test import APIClient

from .conftest import OPERATOR_PASSWORD, make_token

LOGIN = "/admin/login/?next=/admin/"
LIMIT = 5
COOL_OFF = dt.timedelta(minutes=15)
HERE, ELSEWHERE = "198.51.100.7", "203.0.113.9"


def log_in(password: str, username: str = "operator", address: str = HERE, client: Client | None = None):
    """One try at the admin's login form; the response and the client (logged in or not)."""
    client = client or Client()
    response = client.post(LOGIN, {"username": username, "password": password}, REMOTE_ADDR=address)
    return response, client


def logged_in(response) -> bool:
    return response.status_code == 302 and response["Location"] == "/admin/"


def fail(times: int, username: str = "operator", address: str = HERE) -> list[int]:
    return [log_in("wrong password", username, address)[0].status_code for _ in range(times)]


def age_attempts(by: dt.timedelta) -> None:
    """The clock moves on by `by`, as far as the lockout can tell."""
    for attempt in AccessAttempt.objects.all():
        AccessAttempt.objects.filter(pk=attempt.pk).update(attempt_time=attempt.attempt_time - by)


@pytest.fixture
def fast_hashing(settings):
    """A cheap password hash: the lockout is what is tested here, not the hash, and each try
    at the form hashes a password."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def operator(fast_hashing, operator_with_password):
    return operator_with_password


def test_the_policy_is_five_failures_per_username_and_address_for_15_minutes():
    assert settings.AXES_FAILURE_LIMIT == LIMIT
    assert settings.AXES_COOLOFF_TIME == COOL_OFF
    assert settings.AXES_LOCKOUT_PARAMETERS == [["username", "ip_address"]]
    assert settings.AUTHENTICATION_BACKENDS[0] == "axes.backends.AxesStandaloneBackend"
    assert settings.MIDDLEWARE[-1] == "axes.middleware.AxesMiddleware"


def test_four_failures_only_show_the_form_again_and_the_right_password_then_works(operator):
    assert fail(LIMIT - 1) == [200] * (LIMIT - 1)
    assert logged_in(log_in(OPERATOR_PASSWORD)[0])


def test_the_fifth_failure_locks_out_and_then_even_the_right_password_is_refused(operator):
    assert fail(LIMIT) == [200] * (LIMIT - 1) + [429]
    response, client = log_in(OPERATOR_PASSWORD)
    assert response.status_code == 429
    assert "too many login attempts" in response.content.decode()
    assert "_auth_user_id" not in client.session
    assert client.get("/admin/").status_code == 302  # to the login page: not logged in


def test_after_the_cool_off_the_right_password_works_again(operator):
    fail(LIMIT)
    age_attempts(COOL_OFF - dt.timedelta(seconds=5))
    assert log_in(OPERATOR_PASSWORD)[0].status_code == 429  # not yet; and this try restarts the wait
    age_attempts(COOL_OFF - dt.timedelta(seconds=5))
    assert log_in(OPERATOR_PASSWORD)[0].status_code == 429
    age_attempts(COOL_OFF + dt.timedelta(seconds=1))
    response, client = log_in(OPERATOR_PASSWORD)
    assert logged_in(response)
    assert client.get("/admin/").status_code == 200


def test_the_lockout_holds_that_username_from_that_address_only(operator):
    get_user_model().objects.create_superuser("second", password=OPERATOR_PASSWORD)
    fail(LIMIT)
    assert logged_in(log_in(OPERATOR_PASSWORD, address=ELSEWHERE)[0])  # the operator, elsewhere
    assert logged_in(log_in(OPERATOR_PASSWORD, username="second")[0])  # another account, here


def test_a_good_login_forgets_the_failures_before_it(operator):
    fail(LIMIT - 1)
    assert logged_in(log_in(OPERATOR_PASSWORD)[0])
    assert fail(LIMIT - 1) == [200] * (LIMIT - 1)
    assert logged_in(log_in(OPERATOR_PASSWORD)[0])


def test_guessing_at_an_account_that_does_not_exist_locks_out_too(operator):
    assert fail(LIMIT, username="root") == [200] * (LIMIT - 1) + [429]


def test_axes_reset_unlocks_at_once(operator):
    fail(LIMIT)
    out = io.StringIO()
    call_command("axes_reset", stdout=out)
    assert logged_in(log_in(OPERATOR_PASSWORD)[0])


def test_axes_reset_username_unlocks_one_account(operator):
    fail(LIMIT)
    call_command("axes_reset_username", "operator", stdout=io.StringIO())
    assert logged_in(log_in(OPERATOR_PASSWORD)[0])


def test_a_failed_login_is_kept_without_its_password(operator):
    fail(1)
    attempt = AccessAttempt.objects.get()
    assert (attempt.username, attempt.ip_address, attempt.failures_since_start) == ("operator", HERE, 1)
    assert "wrong password" not in attempt.post_data


def test_a_lockout_stops_the_login_form_only_not_tokens_or_open_sessions(loaded, operator):
    _, session = log_in(OPERATOR_PASSWORD)  # the operator's browser, logged in before the attack
    fail(LIMIT)
    assert log_in(OPERATOR_PASSWORD)[0].status_code == 429
    assert session.get("/admin/dashboard/").status_code == 200
    assert session.get("/api/v1/tiers").status_code == 200
    token = APIClient(HTTP_AUTHORIZATION=f"Bearer {make_token('admin', 'ops')}")
    assert token.get("/api/v1/tiers").status_code == 200
