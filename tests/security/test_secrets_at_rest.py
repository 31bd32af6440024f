"""No secrets at rest: a dump of the database, or the database file itself, holds no service
token (whole or its secret part), no password and no SECRET_KEY. What it does hold is a
token's prefix and SHA-256 digest, and each password's salted hash."""

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from policies.models import ServiceToken

from .conftest import make_token

ROOT = Path(__file__).resolve().parents[2]
FAILED_PASSWORD = "hunter2-typed-into-the-wrong-account"


def dump() -> str:
    """Every row of every table, as `manage.py dumpdata` writes them."""
    out = io.StringIO()
    call_command("dumpdata", stdout=out)
    return out.getvalue()


def secrets_of(token: str) -> list[str]:
    """The token, and the part of it that is secret (everything after `la_<prefix>_`)."""
    return [token, token.split("_", 2)[2]]


def ensure_operator() -> str:
    """`manage.py ensureoperator`, as `make run` does; the password it prints."""
    out = io.StringIO()
    call_command("ensureoperator", stdout=out)
    return out.getvalue().split("password: ")[1].split()[0]


@pytest.fixture
def credentials(loaded):
    """Tokens of both scopes (one revoked, one used), an operator, and a failed login."""
    decide, admin, retired = make_token("decide", "edge"), make_token("admin", "ops"), make_token("admin", "old")
    row = ServiceToken.objects.get(prefix=retired.split("_")[1])
    row.revoked_at = timezone.now()
    row.save(update_fields=["revoked_at"])
    assert (
        APIClient(HTTP_AUTHORIZATION=f"Bearer {decide}")
        .post("/api/v1/decisions", {"keys": {"team": "acme"}}, format="json")
        .status_code
        == 200
    )
    password = ensure_operator()
    Client().post("/admin/login/", {"username": "operator", "password": FAILED_PASSWORD})
    return {"tokens": [decide, admin, retired], "password": password}


def test_a_dump_holds_no_token_nor_any_tokens_secret_part(credentials):
    text = dump()
    for token in credentials["tokens"]:
        for secret in secrets_of(token):
            assert secret not in text
        # What is there instead: the prefix, to find the row, and the digest, to check it.
        assert token.split("_")[1] in text and hashlib.sha256(token.encode()).hexdigest() in text


def test_a_dump_holds_no_password_only_salted_hashes(credentials):
    text = dump()
    assert credentials["password"] not in text
    assert FAILED_PASSWORD not in text  # the failed login's record masks the password
    assert get_user_model().objects.get(username="operator").password.startswith("pbkdf2_sha256$")


def test_a_dump_holds_no_secret_key(credentials):
    assert settings.SECRET_KEY not in dump()


def test_the_one_credential_at_rest_is_a_live_sessions_key_and_logging_out_removes_it(loaded):
    """docs/SECURITY.md says so: a session key is stored as it is (Django's sessions), for at
    most SESSION_COOKIE_AGE; a dump taken meanwhile could be replayed. Logging out deletes it."""
    password = ensure_operator()
    browser = Client()
    assert browser.post("/admin/login/", {"username": "operator", "password": password}).status_code == 302
    key = browser.cookies[settings.SESSION_COOKIE_NAME].value
    assert key in dump()
    browser.post("/admin/logout/")
    assert key not in dump()  # nor anywhere else: axes' login records keep a hash of it at most


SCRIPT = """
import io, json, sys
import django
django.setup()
from django.core.management import call_command
from django.test import Client
from rest_framework.test import APIClient

def run(*args):
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip().splitlines()

tokens = [run("createservicetoken", name, "--scope", scope)[-1]
          for name, scope in (("edge", "decide"), ("ops", "admin"))]
password = run("ensureoperator")[-1].split("password: ")[1]
decided = APIClient(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION="Bearer " + tokens[0]).post(
    "/api/v1/decisions", {"keys": {"team": "t"}}, format="json")
failed = Client(HTTP_HOST="127.0.0.1").post("/admin/login/", {"username": "operator", "password": sys.argv[1]})
print(json.dumps({"tokens": tokens, "password": password, "statuses": [decided.status_code, failed.status_code]}))
"""


def test_the_database_files_bytes_hold_no_token_and_no_password(tmp_path):
    """The file itself, free pages and journal included, as a stolen disk or backup would."""
    database = tmp_path / "db.sqlite3"
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{database}", "DJANGO_SETTINGS_MODULE": "limiter_admin.settings"}
    env.pop("REDIS_URL", None)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    subprocess.run(
        [sys.executable, "manage.py", "loadpolicies", "demo"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, FAILED_PASSWORD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout.strip().splitlines()[-1])
    assert made["statuses"] == [200, 200]  # a decision made, a login refused (and recorded)
    files = [path for path in tmp_path.iterdir() if path.name.startswith("db.sqlite3")]
    raw = b"".join(path.read_bytes() for path in files)
    assert hashlib.sha256(made["tokens"][0].encode()).hexdigest().encode() in raw  # the rows are there
    for token in made["tokens"]:
        for secret in secrets_of(token):
            assert secret.encode() not in raw
    for password in (made["password"], FAILED_PASSWORD):
        assert password.encode() not in raw


def test_an_alerts_secret_is_in_its_row_alone(loaded):
    """The one secret a dump holds on purpose: each alert's, which every delivery is signed
    with (a digest could not sign). Never in the alert's history, the log, or an export."""
    secret = "whsec-at-rest-7b3e0c"
    client = APIClient(HTTP_AUTHORIZATION=f"Bearer {make_token('admin', 'ops')}")
    alert = {"name": "q", "kind": "quota_used", "threshold": 0.8, "url": "http://127.0.0.1:9/", "secret": secret}
    assert client.post("/api/v1/alerts", alert, format="json").status_code == 201
    assert client.patch("/api/v1/alerts/q", {"threshold": 0.9, "version": 1}, format="json").status_code == 200
    rows = [row for row in json.loads(dump()) if secret in json.dumps(row)]
    assert [(row["model"], row["fields"]["secret"]) for row in rows] == [("policies.alert", secret)]
    out = io.StringIO()
    call_command("exportpolicies", stdout=out)
    assert secret not in out.getvalue()
