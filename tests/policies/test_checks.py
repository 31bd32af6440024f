"""The start-up checks: every tier and overridden tenant compiles; LIMITER_AUTHZ_MIN_COST is a
cost or 0."""

import math
import os
import subprocess
import sys

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from limiter_admin.env import env_number
from policies.checks import check_authz_min_cost, check_policies_compile
from policies.models import Level, Rule, Tier
from tests.serving import ROOT

pytestmark = pytest.mark.django_db


def test_a_loaded_policy_passes_the_check(load, policy):
    load(policy)
    assert check_policies_compile() == []


def test_a_tier_whose_rules_cannot_build_a_limiter_is_reported_as_policies_e001():
    level = Level.objects.create(name="user", position=0)
    tier = Tier.objects.create(name="broken")
    # Two identical rules at one level: each row is valid alone, together they are one bucket.
    spec = {"capacity": 5, "per_second": 1}
    Rule.objects.create(tier=tier, level=level, type="token_bucket", params=spec, position=0)
    Rule.objects.create(tier=tier, level=level, type="token_bucket", params=spec, position=1)
    errors = check_policies_compile()
    assert [error.id for error in errors] == ["policies.E001"]
    assert "broken" in errors[0].msg and "repeats rule 0" in errors[0].msg


def test_the_check_runs_with_the_projects_checks():
    assert all(error.id != "policies.E001" for error in run_checks(tags=["policies"]))


@pytest.mark.parametrize("floor", [0, 0.5, 1, 2, 1e15])
def test_a_min_cost_of_0_or_a_cost_passes_the_check(settings, floor):
    settings.LIMITER_AUTHZ_MIN_COST = floor
    assert check_authz_min_cost() == []


@pytest.mark.parametrize("floor", [-1, math.nan, math.inf, 1e16, "1", True, None])
def test_a_bad_min_cost_is_a_start_up_error_that_names_it(settings, floor):
    settings.LIMITER_AUTHZ_MIN_COST = floor
    errors = check_authz_min_cost()
    assert [error.id for error in errors] == ["policies.E006"]
    assert errors[0].msg == f"LIMITER_AUTHZ_MIN_COST must be a number from 0 (no floor) to 1e+15, not {floor!r}"
    with pytest.raises(SystemCheckError, match="policies.E006"):
        call_command("check")


def test_the_min_cost_is_1_unless_the_environment_says_otherwise(settings, monkeypatch):
    monkeypatch.delenv("LIMITER_AUTHZ_MIN_COST", raising=False)
    assert env_number("LIMITER_AUTHZ_MIN_COST", 1) == 1
    monkeypatch.setenv("LIMITER_AUTHZ_MIN_COST", "")
    assert env_number("LIMITER_AUTHZ_MIN_COST", 1) == 1
    monkeypatch.setenv("LIMITER_AUTHZ_MIN_COST", "0.5")
    assert env_number("LIMITER_AUTHZ_MIN_COST", 1) == 0.5
    monkeypatch.setenv("LIMITER_AUTHZ_MIN_COST", "one")
    with pytest.raises(ImproperlyConfigured, match="LIMITER_AUTHZ_MIN_COST='one': expected a number"):
        env_number("LIMITER_AUTHZ_MIN_COST", 1)


@pytest.mark.parametrize(
    "value, said", [("one", "LIMITER_AUTHZ_MIN_COST='one': expected a number"), ("-1", "policies.E006")]
)
def test_manage_py_check_refuses_a_bad_min_cost_from_the_environment(tmp_path, value, said):
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3",
        "DJANGO_SETTINGS_MODULE": "limiter_admin.settings",
        "LIMITER_AUTHZ_MIN_COST": value,
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and said in done.stderr
