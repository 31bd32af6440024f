"""The deployment check: with production settings (DEBUG=0 HTTPS_ONLY=1, a real SECRET_KEY,
ALLOWED_HOSTS set) `manage.py check --deploy --fail-level WARNING` passes, and the settings
do what it checks for. Each case starts a fresh Python with that environment, since the
settings are read from the environment once, at start-up. CI runs these with `make test`."""

import json
import os
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOST = "limiter.example.com"


def environment(tmp_path, **variables) -> dict:
    """The process's environment with the settings' variables replaced by these only."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("DEBUG", "HTTPS_ONLY", "SECRET_KEY", "ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS", "REDIS_URL")
    }
    return {
        **env,
        "DJANGO_SETTINGS_MODULE": "limiter_admin.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        **variables,
    }


def production(tmp_path, **more) -> dict:
    return environment(
        tmp_path,
        **{"DEBUG": "0", "HTTPS_ONLY": "1", "SECRET_KEY": secrets.token_urlsafe(50), "ALLOWED_HOSTS": HOST, **more},
    )


def deploy_check(env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def in_django(env, code: str) -> dict:
    """Run `code` in a fresh Django process with `env`; it leaves its findings in `out`."""
    script = "import django, json\ndjango.setup()\nout = {}\n" + textwrap.dedent(code) + "\nprint(json.dumps(out))"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the check ---------------------------------------------------------------------------------


def test_the_deploy_check_passes_with_production_settings(tmp_path):
    done = deploy_check(production(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout + done.stderr


def test_the_deploy_check_catches_a_forgotten_secret_key(tmp_path):
    env = production(tmp_path)
    del env["SECRET_KEY"]
    done = deploy_check(env)
    assert done.returncode != 0
    assert "security.W009" in done.stderr  # the development key


def test_the_deploy_check_catches_debug_left_on(tmp_path):
    done = deploy_check(production(tmp_path, DEBUG="1"))
    assert done.returncode != 0
    assert "security.W018" in done.stderr


def test_plain_http_on_loopback_is_no_deployment_the_check_would_pass(tmp_path):
    """DEBUG=0 alone serves plain HTTP (for loopback); the check says what it lacks."""
    done = deploy_check(environment(tmp_path, DEBUG="0", SECRET_KEY=secrets.token_urlsafe(50)))
    assert done.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in done.stderr


# --- what the settings do ----------------------------------------------------------------------

ASK = """
from django.test import Client
from django.conf import settings

def ask(path, secure, **headers):
    client = Client(HTTP_HOST="{host}", **({{"HTTP_X_FORWARDED_PROTO": "https"}} if secure else {{}}))
    response = client.get(path, **headers)
    return {{"status": response.status_code, "location": response.get("Location", ""),
             "headers": dict(response.headers),
             "cookies": {{name: {{"secure": bool(c["secure"]), "httponly": bool(c["httponly"]),
                                 "samesite": c["samesite"]}} for name, c in response.cookies.items()}}}}

out["login_http"] = ask("/admin/login/", secure=False)
out["login_https"] = ask("/admin/login/", secure=True)
out["probes_http"] = [ask(path, secure=False)["status"] for path in ("/healthz", "/metrics")]
out["trusted_origins"] = settings.CSRF_TRUSTED_ORIGINS
out["session_age"] = settings.SESSION_COOKIE_AGE
"""


@pytest.fixture(scope="module")
def behind_tls(tmp_path_factory):
    env = production(tmp_path_factory.mktemp("tls"), CSRF_TRUSTED_ORIGINS=f"https://{HOST},https://ops.example.com")
    return in_django(env, ASK.format(host=HOST))


def test_plain_http_is_sent_to_https(behind_tls):
    assert behind_tls["login_http"]["status"] == 301
    assert behind_tls["login_http"]["location"] == f"https://{HOST}/admin/login/"


def test_probes_and_metrics_answer_over_plain_http_for_the_load_balancer_and_prometheus(behind_tls):
    assert behind_tls["probes_http"] == [200, 200]


def test_https_answers_carry_hsts_and_the_hardening_headers(behind_tls):
    headers = behind_tls["login_https"]["headers"]
    assert behind_tls["login_https"]["status"] == 200
    assert headers["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload"
    assert headers["X-Frame-Options"] == "DENY"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Referrer-Policy"] == "same-origin"
    assert headers["Cross-Origin-Opener-Policy"] == "same-origin"


def test_the_csrf_cookie_is_secure_behind_tls(behind_tls):
    assert behind_tls["login_https"]["cookies"]["csrftoken"] == {"secure": True, "httponly": False, "samesite": "Lax"}


def test_trusted_origins_come_from_the_environment(behind_tls):
    assert behind_tls["trusted_origins"] == [f"https://{HOST}", "https://ops.example.com"]


def test_an_operators_session_lasts_a_working_day(behind_tls):
    assert behind_tls["session_age"] == 12 * 60 * 60


def test_debug_off_without_https_only_still_serves_plain_http_on_loopback(tmp_path):
    env = environment(tmp_path, DEBUG="0", SECRET_KEY=secrets.token_urlsafe(50))
    found = in_django(env, ASK.format(host="127.0.0.1"))
    assert found["login_http"]["status"] == 200
    assert found["login_http"]["cookies"]["csrftoken"]["secure"] is False
    assert "Strict-Transport-Security" not in found["login_http"]["headers"]


def test_the_session_cookie_is_secure_and_out_of_scripts_reach_behind_tls(tmp_path):
    env = production(tmp_path)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    found = in_django(
        env,
        f"""
        from django.contrib.auth import get_user_model
        from django.test import Client
        get_user_model().objects.create_superuser("operator", password="a-long-test-password-9")
        client = Client(HTTP_HOST="{HOST}", HTTP_X_FORWARDED_PROTO="https")
        response = client.post("/admin/login/", {{"username": "operator", "password": "a-long-test-password-9"}})
        cookie = response.cookies["sessionid"]
        out["status"] = response.status_code
        out["session"] = {{"secure": bool(cookie["secure"]), "httponly": bool(cookie["httponly"]),
                          "samesite": cookie["samesite"], "max_age": cookie["max-age"]}}
    """,
    )
    assert found["status"] == 302
    assert found["session"] == {"secure": True, "httponly": True, "samesite": "Lax", "max_age": 43200}
