"""Model validation: each kind of bad value is refused, naming the field, using the
engine's own declarations."""

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError

from core import RULES
from policies.models import Level, PriorityClass, Rule, Tenant, Tier, rule_type_choices

pytestmark = pytest.mark.django_db


@pytest.fixture
def level():
    return Level.objects.create(name="team", position=1)


@pytest.fixture
def tier(level):
    tier = Tier.objects.create(name="pro")
    Rule.objects.create(tier=tier, level=level, type="token_bucket", params={"capacity": 10, "per_second": 1})
    return tier


def errors_of(obj):
    with pytest.raises(ValidationError) as caught:
        obj.full_clean()
    return caught.value.message_dict


def rule(level, **fields):
    fields.setdefault("type", "token_bucket")
    fields.setdefault("params", {"capacity": 10, "per_second": 1})
    return Rule(level=level, **fields)


def test_the_rule_type_choices_are_the_engines_registry():
    assert [name for name, _ in rule_type_choices()] == sorted(RULES)
    assert Rule._meta.get_field("type").choices == rule_type_choices()


def test_a_valid_global_rule_passes(level):
    rule(level).full_clean()


def test_it_rejects_a_parameter_below_its_minimum_naming_the_parameter(level):
    errors = errors_of(rule(level, params={"capacity": -1, "per_second": 1}))
    assert "capacity" in errors["params"][0] and "greater than 0" in errors["params"][0]


def test_it_rejects_a_missing_parameter(level):
    errors = errors_of(rule(level, params={"capacity": 10}))
    assert errors["params"] == ["per_second: is required (token_bucket)"]


def test_it_rejects_an_unknown_parameter_listing_the_known_ones(level):
    errors = errors_of(rule(level, params={"capacity": 10, "per_second": 1, "burst": 5}))
    assert "unknown parameter 'burst'" in errors["params"][0]
    assert "capacity, per_second" in errors["params"][0]


def test_it_rejects_a_parameter_of_the_wrong_kind(level):
    errors = errors_of(rule(level, type="concurrency", params={"limit": 2.5}))
    assert "limit: must be a whole number" in errors["params"][0]


def test_it_rejects_params_that_are_not_a_mapping(level):
    assert "params" in errors_of(rule(level, params=[10, 1]))


def test_it_rejects_an_unknown_rule_type(level):
    assert "type" in errors_of(rule(level, type="leaky_bucket"))


def test_it_rejects_a_rule_owned_by_a_tier_and_a_tenant(tier, level):
    tenant = Tenant.objects.create(key="acme", tier=tier)
    errors = errors_of(rule(level, tier=tier, tenant=tenant))
    assert "never both" in errors["__all__"][0]


def test_the_database_refuses_a_rule_with_two_owners(tier, level):
    tenant = Tenant.objects.create(key="acme", tier=tier)
    with pytest.raises(IntegrityError), transaction.atomic():
        Rule.objects.create(tier=tier, tenant=tenant, level=level, type="gcra", params={"rate": 1, "burst": 1})


def test_it_rejects_a_fallback_fraction_of_zero():
    errors = errors_of(Level(name="global", fail_mode="local", fallback_fraction=0))
    assert "above 0" in errors["fallback_fraction"][0]


def test_it_rejects_an_unknown_fail_mode():
    assert "fail_mode" in errors_of(Level(name="global", fail_mode="sometimes"))


def test_it_rejects_a_watermark_of_one():
    errors = errors_of(PriorityClass(name="batch", watermark=1.0))
    assert "up to (not including) 1" in errors["watermark"][0]


def test_it_rejects_a_negative_watermark():
    assert "watermark" in errors_of(PriorityClass(name="batch", watermark=-0.1))


def test_a_tier_in_use_by_a_tenant_cannot_be_deleted(tier):
    Tenant.objects.create(key="acme", tier=tier)
    with pytest.raises(ProtectedError):
        tier.delete()


def test_it_rejects_a_tenant_pointing_at_a_deleted_tier(tier):
    tenant = Tenant(key="acme", tier_id=tier.pk + 1000)
    assert errors_of(tenant)["tier"]


def test_it_rejects_a_level_name_with_spaces():
    assert "name" in errors_of(Level(name="per user"))


@pytest.mark.parametrize("model", [Level, Tier, PriorityClass])
@pytest.mark.parametrize("name", ["gold\n", "go ld", "", "gold\r\n"])
def test_a_name_must_be_letters_digits_and_marks_to_its_very_end(model, name):
    # `$` would match before a trailing newline: the admin path uses the model's validator.
    assert "name" in errors_of(model(name=name))


def test_a_plain_name_passes_the_name_validator():
    Tier(name="gold-2.b:c_d").clean_fields(exclude=["rules"])
