"""The project runs: health probe, admin, operator account, settings from the environment."""

import io
import re
import runpy
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command

from limiter_admin.env import env_bool, env_list

ROOT = Path(__file__).resolve().parent.parent
SETTINGS_FILE = ROOT / "limiter_admin" / "settings.py"
SETTINGS_VARIABLES = ("SECRET_KEY", "DEBUG", "ALLOWED_HOSTS", "DATABASE_URL", "REDIS_URL", "HTTPS_ONLY")


def ensure_operator(*args):
    """Run ensureoperator and return what it printed."""
    out = io.StringIO()
    call_command("ensureoperator", *args, stdout=out)
    return out.getvalue()


def printed_password(output):
    return re.search(r"^password: (\S+)$", output, re.MULTILINE).group(1)


def load_settings(monkeypatch, **env):
    """Evaluate settings.py afresh under exactly `env` for the settings variables."""
    for name in SETTINGS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(SETTINGS_FILE))


def test_healthz_answers_ok_in_json(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"status": "ok"}


def test_healthz_refuses_a_post(client):
    assert client.post("/healthz").status_code == 405


def test_the_admin_sends_an_anonymous_visitor_to_the_login_page(client):
    response = client.get("/admin/")
    assert response.status_code == 302
    assert response["Location"] == "/admin/login/?next=/admin/"


@pytest.mark.django_db
def test_ensureoperator_creates_a_superuser_who_can_log_in(client):
    output = ensure_operator()
    assert "username: operator" in output
    password = printed_password(output)

    response = client.post("/admin/login/?next=/admin/", {"username": "operator", "password": password})
    assert response.status_code == 302
    assert response["Location"] == "/admin/"
    assert client.get("/admin/").status_code == 200
    assert get_user_model().objects.get(username="operator").is_superuser


@pytest.mark.django_db
def test_ensureoperator_takes_the_username_from_the_option():
    output = ensure_operator("--username", "oncall")
    assert "username: oncall" in output
    assert get_user_model().objects.get(username="oncall").is_superuser


@pytest.mark.django_db
def test_ensureoperator_leaves_an_existing_account_alone():
    password = printed_password(ensure_operator())

    output = ensure_operator()

    assert "already exists" in output
    assert "--reset" in output
    assert "password:" not in output
    assert get_user_model().objects.get(username="operator").check_password(password)


@pytest.mark.django_db
def test_ensureoperator_reset_gives_the_account_a_new_password():
    old = printed_password(ensure_operator())

    new = printed_password(ensure_operator("--reset"))

    user = get_user_model().objects.get(username="operator")
    assert new != old
    assert user.check_password(new)
    assert not user.check_password(old)


@pytest.mark.parametrize("raw, expected", [("1", True), ("0", False), (" TRUE ", True), ("off", False), ("", False)])
def test_env_bool_reads_the_usual_spellings(monkeypatch, raw, expected):
    monkeypatch.setenv("SOME_FLAG", raw)
    assert env_bool("SOME_FLAG", default=not expected) is expected


def test_env_bool_falls_back_to_the_default_when_unset(monkeypatch):
    monkeypatch.delenv("SOME_FLAG", raising=False)
    assert env_bool("SOME_FLAG", default=True) is True


def test_env_bool_rejects_a_value_it_cannot_read(monkeypatch):
    monkeypatch.setenv("SOME_FLAG", "O")
    with pytest.raises(ImproperlyConfigured, match="SOME_FLAG"):
        env_bool("SOME_FLAG", default=True)


def test_env_list_splits_on_commas_and_drops_blanks(monkeypatch):
    monkeypatch.setenv("SOME_LIST", " a.example ,b.example,, ")
    assert env_list("SOME_LIST", default=["x"]) == ["a.example", "b.example"]


def test_env_list_falls_back_to_the_default_when_unset(monkeypatch):
    monkeypatch.delenv("SOME_LIST", raising=False)
    assert env_list("SOME_LIST", default=["x"]) == ["x"]


def test_settings_default_to_debug_on_loopback_with_sqlite_and_memory_cache(monkeypatch):
    settings = load_settings(monkeypatch)
    assert settings["DEBUG"] is True
    assert settings["ALLOWED_HOSTS"] == ["127.0.0.1", "localhost"]
    assert settings["DATABASES"]["default"]["ENGINE"] == "django.db.backends.sqlite3"
    assert settings["CACHES"]["default"]["BACKEND"].endswith("LocMemCache")
    assert not settings.get("SECURE_SSL_REDIRECT", False)


def test_settings_honour_debug_off_and_the_allowed_hosts(monkeypatch):
    settings = load_settings(monkeypatch, DEBUG="0", ALLOWED_HOSTS="limits.example, 10.0.0.5")
    assert settings["DEBUG"] is False
    assert settings["ALLOWED_HOSTS"] == ["limits.example", "10.0.0.5"]


def test_settings_use_redis_for_the_cache_when_redis_url_is_set(monkeypatch):
    settings = load_settings(monkeypatch, REDIS_URL="redis://127.0.0.1:6379/3")
    cache = settings["CACHES"]["default"]
    assert cache["BACKEND"] == "django_redis.cache.RedisCache"
    assert cache["LOCATION"] == "redis://127.0.0.1:6379/3"


def test_settings_read_the_database_url(monkeypatch):
    settings = load_settings(monkeypatch, DATABASE_URL="postgres://app:pw@db.internal:5432/limits")
    database = settings["DATABASES"]["default"]
    assert database["ENGINE"] == "django.db.backends.postgresql"
    assert (database["HOST"], database["NAME"]) == ("db.internal", "limits")


def test_https_only_turns_on_redirect_hsts_and_secure_cookies(monkeypatch):
    settings = load_settings(monkeypatch, HTTPS_ONLY="1")
    assert settings["SECURE_SSL_REDIRECT"] is True
    assert settings["SECURE_HSTS_SECONDS"] == 31536000
    assert settings["SECURE_HSTS_INCLUDE_SUBDOMAINS"] and settings["SECURE_HSTS_PRELOAD"]
    assert settings["SESSION_COOKIE_SECURE"] and settings["CSRF_COOKIE_SECURE"]
    assert settings["SECURE_PROXY_SSL_HEADER"] == ("HTTP_X_FORWARDED_PROTO", "https")


@pytest.mark.slow
def test_the_deploy_check_passes_behind_tls_with_a_real_secret_key(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "DEBUG": "0",
        "HTTPS_ONLY": "1",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'deploy.sqlite3'}",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_sites_root_goes_to_the_console(client):
    """Issue 25: `/` was a 404 debug page under `make run`."""
    response = client.get("/", follow=True)
    assert response.redirect_chain == [("/admin/dashboard/", 302), ("/admin/login/?next=/admin/dashboard/", 302)]
    assert response.status_code == 200 and b"Log in" in response.content


def test_the_favicon_is_served_and_logs_no_404(client, caplog):
    """Issue 25: every page logged `Not Found: /favicon.ico`."""
    with caplog.at_level("WARNING", logger="django.request"):
        response = client.get("/favicon.ico")
    assert response.status_code == 200
    icon = b"".join(response.streaming_content)
    assert icon[:4] == b"\x00\x00\x01\x00" and b"PNG" in icon[:40]  # an ICO holding one PNG
    assert response["Content-Type"] in ("image/x-icon", "image/vnd.microsoft.icon")
    assert not caplog.records
