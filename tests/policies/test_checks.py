"""The start-up check compiles every tier and overridden tenant."""

import pytest
from django.core.checks import run_checks

from policies.checks import check_policies_compile
from policies.models import Level, Rule, Tier

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
