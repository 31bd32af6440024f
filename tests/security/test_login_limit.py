"""A limit on the admin's login form per client address (limiter_admin/login_limit.py): a
stranger posting the form with a fresh username each time is never locked out by username,
so the address is limited, before any password is hashed (issue 26's login storm)."""

import os
import subprocess
import sys

import pytest
from axes.models import AccessAttempt
from django.core.management import call_command
from django.test import Client

from policies.checks import check_whatif_settings
from tests.serving import ROOT

LOGIN = "/admin/login/?next=/admin/"
HERE, ELSEWHERE = "198.51.100.7", "203.0.113.9"

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def small_limit(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # the limit is tested, not the hash
    settings.LIMITER_LOGIN_ATTEMPTS = 3
    settings.LIMITER_LOGIN_PER_MINUTE = 1


def post(username: str, address: str = HERE):
    return Client().post(LOGIN, {"username": username, "password": "wrong"}, REMOTE_ADDR=address)


def test_an_address_past_its_attempts_gets_429_before_any_password_is_checked():
    assert [post(f"stranger-{i}").status_code for i in range(3)] == [200, 200, 200]
    checked = AccessAttempt.objects.count()
    refused = post("stranger-3")
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert b"Too many login attempts" in refused.content
    # Not checked: django-axes saw no attempt of that username.
    assert AccessAttempt.objects.count() == checked
    assert not AccessAttempt.objects.filter(username="stranger-3").exists()


def test_another_address_is_not_held_back_by_the_first():
    for i in range(4):
        post(f"stranger-{i}")
    assert post("stranger-9", ELSEWHERE).status_code == 200


def test_the_login_page_itself_is_not_limited():
    for i in range(4):
        post(f"stranger-{i}")
    assert Client().get(LOGIN, REMOTE_ADDR=HERE).status_code == 200


def test_an_operator_with_the_right_password_gets_in_within_the_limit(django_user_model):
    django_user_model.objects.create_superuser("operator", password="right password")
    client = Client()
    answer = client.post(LOGIN, {"username": "operator", "password": "right password"}, REMOTE_ADDR=HERE)
    assert answer.status_code == 302 and answer["Location"] == "/admin/"


@pytest.mark.parametrize(
    "name, value",
    [
        ("LIMITER_LOGIN_ATTEMPTS", 0),
        ("LIMITER_LOGIN_PER_MINUTE", -1),
        ("LIMITER_WHATIF_CONCURRENCY", 0),
        ("LIMITER_WHATIF_QUEUE", -1),
        ("LIMITER_WHATIF_SECONDS", "60"),
        ("LIMITER_WHATIF_MAX_TENANTS", True),
        ("LIMITER_WHATIF_MAX_RULES", 0.5),
    ],
)
def test_a_bad_bound_is_a_start_up_error_naming_the_setting(settings, name, value):
    setattr(settings, name, value)
    [error] = check_whatif_settings()
    assert error.id == "policies.E007" and error.msg.startswith(name)


def test_a_setting_that_is_no_whole_number_stops_the_process_with_a_message():
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={**os.environ, "LIMITER_WHATIF_SECONDS": "two minutes"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "LIMITER_WHATIF_SECONDS='two minutes': expected a whole number" in done.stderr


def test_the_defaults_pass():
    call_command("check")
    assert check_whatif_settings() == []
