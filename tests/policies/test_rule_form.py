"""Editing rules in the admin (policies/admin/rule_form.py): a typed field per parameter of the rule
type, built from its declarations in core.RULES, with its bounds and help on the page before
anything is saved; JSON for plug-in types; a bad value is an error on its own field, never a
500, and nothing is saved."""

import html
import re

import pytest
from django.contrib.auth import get_user_model

from core import RULES
from policies.admin.rule_form import bounds, is_typed
from policies.models import Level, Rule, Tier

from .test_admin import params_data, tier_form

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client):
    client.force_login(get_user_model().objects.create_superuser("operator", password="pw-for-tests"))
    return client


@pytest.fixture
def loaded(load, policy):
    load(policy)


def free() -> Tier:
    return Tier.objects.get(name="free")


def group(page: str, row: str, rule_type: str) -> str:
    """The fieldset of one rule type's parameters in one row (`rules-0-`, or `` on a rule's page)."""
    start = page.index(f'id="id_{row}{rule_type}__')
    start = page.rindex("<fieldset", 0, start)
    return page[start : page.index("</fieldset>", start)]


def param_box(page: str, row: str, rule_type: str, name: str) -> str:
    """One parameter's box: its label, input, bounds, errors and help."""
    start = page.rindex('<div class="rule-param', 0, page.index(f'id="id_{row}{rule_type}__{name}"'))
    return page[start : page.index('<div class="help param-help"', start)]


def post_tier(client, tier, **changes):
    response = client.post(f"/admin/policies/tier/{tier.pk}/change/", tier_form(tier, **changes))
    return response, html.unescape(response.content.decode())


# --- what the page shows ----------------------------------------------------------------------------


def test_every_built_in_rule_type_gets_typed_fields_and_a_plug_in_does_not(plugin_rule):
    assert all(is_typed(name) for name in ("token_bucket", "gcra", "sliding_window", "concurrency"))
    assert not is_typed(plugin_rule) and not is_typed("no_such_type") and not is_typed(None)


def test_bounds_are_read_from_the_declaration():
    capacity, per_second = RULES["token_bucket"].params
    limit, lease = RULES["concurrency"].params
    assert bounds(capacity) == "number > 0, required"
    assert bounds(per_second) == "number ≥ 0, required"
    assert bounds(limit) == "integer ≥ 1, at most 1000000, required"
    assert bounds(lease) == "number > 0, at most 86400, default 60"


def test_a_tier_page_shows_each_rules_typed_fields_with_bounds_and_help(operator, loaded):
    page = html.unescape(operator.get(f"/admin/policies/tier/{free().pk}/change/").content.decode())
    capacity = param_box(page, "rules-0-", "token_bucket", "capacity")
    assert 'type="number"' in capacity and 'value="10"' in capacity and "number > 0, required" in capacity
    assert "Most tokens the bucket holds: the largest burst." in page
    # Every typed type's fields are on the page already, only the chosen type's shown.
    assert " hidden" not in group(page, "rules-0-", "token_bucket").split(">", 1)[0]
    gcra = group(page, "rules-0-", "gcra")
    assert gcra.split(">", 1)[0].endswith(" hidden") and "Requests (or cost units) per second, sustained." in gcra
    assert 'src="/static/policies/rule_params.js"' in page


def test_an_optional_parameter_shows_its_default_as_a_placeholder(operator, loaded):
    page = operator.get(f"/admin/policies/tier/{free().pk}/change/").content.decode()
    lease = param_box(page, "rules-0-", "concurrency", "lease")
    assert 'placeholder="60"' in lease and 'step="any"' in lease and 'max="86400"' in lease


def test_a_choice_is_a_select_of_its_choices_and_an_optional_text_has_no_placeholder(operator, loaded):
    page = html.unescape(operator.get(f"/admin/policies/tier/{free().pk}/change/").content.decode())
    period = param_box(page, "rules-0-", "quota", "period")
    assert "<select" in period and '<option value="month">month</option>' in period
    assert '<option value="" selected>(required)</option>' in period
    assert "one of hour, day, week, month, none, required" in period
    mode = param_box(page, "rules-0-", "quota", "mode")
    assert '<option value="" selected>(default: hard)</option>' in mode
    timezone = param_box(page, "rules-0-", "quota", "timezone")
    assert '<option value="Europe/Berlin">Europe/Berlin</option>' in timezone
    assert '<option value="" selected>(default: UTC)</option>' in timezone and "one of 59" in timezone
    demote_to = param_box(page, "rules-0-", "quota", "demote_to")
    assert "placeholder" not in demote_to and "string, optional" in demote_to


def test_a_quota_is_saved_from_its_typed_fields(operator, loaded):
    rules = list(free().rules.all())
    data = tier_form(free(), rules=rules)
    data |= {
        "rules-0-type": "quota",
        "rules-0-quota__limit": "100000",
        "rules-0-quota__period": "month",
        "rules-0-quota__timezone": "Europe/Berlin",
        "rules-0-quota__mode": "",
        "rules-0-quota__demote_to": "",
    }
    assert operator.post(f"/admin/policies/tier/{free().pk}/change/", data).status_code == 302
    rule = Rule.objects.get(pk=rules[0].pk)
    assert (rule.type, rule.params) == ("quota", {"limit": 100000, "period": "month", "timezone": "Europe/Berlin"})
    page = html.unescape(operator.get(f"/admin/policies/tier/{free().pk}/change/").content.decode())
    assert '<option value="month" selected>month</option>' in param_box(page, "rules-0-", "quota", "period")


def test_an_unknown_time_zone_is_an_error_on_its_field(operator, loaded):
    rules = list(free().rules.all())
    data = tier_form(free(), rules=rules)
    data |= {"rules-0-type": "quota", "rules-0-quota__limit": "10", "rules-0-quota__period": "day"}
    data["rules-0-quota__timezone"] = "Mars/Olympus"
    page = html.unescape(operator.post(f"/admin/policies/tier/{free().pk}/change/", data).content.decode())
    assert "unknown time zone 'Mars/Olympus'" in param_box(page, "rules-0-", "quota", "timezone")
    assert Rule.objects.get(pk=rules[0].pk).type == "token_bucket"


def test_a_new_rule_asks_for_a_type_first(operator, loaded):
    page = operator.get("/admin/policies/rule/add/").content.decode()
    assert "Pick a rule type: its parameters show here." in page
    assert '<p class="pick-a-type help">' in page  # shown: no type yet


# --- saving -------------------------------------------------------------------------------------------


def test_a_changed_parameter_is_saved_as_a_number(operator, loaded):
    rules = list(free().rules.all())
    rules[0].params = {"capacity": 25, "per_second": 0.5}
    response, _ = post_tier(operator, free(), rules=rules)
    assert response.status_code == 302
    assert Rule.objects.get(pk=rules[0].pk).params == {"capacity": 25, "per_second": 0.5}


def test_saving_a_tier_unchanged_saves_none_of_its_rules(operator, loaded):
    rules = list(free().rules.all())
    records = {rule.pk: rule.history.count() for rule in rules}
    response, _ = post_tier(operator, free())
    assert response.status_code == 302
    assert {rule.pk: rule.history.count() for rule in rules} == records


def test_a_rule_changed_to_another_type_takes_that_types_fields(operator, loaded):
    rules = list(free().rules.all())
    data = tier_form(free(), rules=rules)
    data["rules-0-type"] = "gcra"
    data |= {"rules-0-gcra__rate": "5", "rules-0-gcra__burst": "20"}  # the token bucket's fields stay, unread
    response = operator.post(f"/admin/policies/tier/{free().pk}/change/", data)
    assert response.status_code == 302
    rule = Rule.objects.get(pk=rules[0].pk)
    assert (rule.type, rule.params) == ("gcra", {"rate": 5, "burst": 20})


def test_an_optional_parameter_left_empty_takes_its_default(operator, loaded):
    rules = list(free().rules.all())
    data = tier_form(free(), rules=rules)
    data |= {"rules-1-type": "concurrency", "rules-1-concurrency__limit": "5", "rules-1-concurrency__lease": ""}
    assert operator.post(f"/admin/policies/tier/{free().pk}/change/", data).status_code == 302
    assert Rule.objects.get(pk=rules[1].pk).params == {"limit": 5}


def test_a_new_rule_is_added_with_its_typed_fields(operator, loaded):
    data = tier_form(free())
    data |= {
        "rules-TOTAL_FORMS": 3,
        "rules-2-tier": free().pk,
        "rules-2-level": Level.objects.get(name="user").pk,
        "rules-2-type": "sliding_window",
        "rules-2-sliding_window__limit": "600",
        "rules-2-sliding_window__window": "60",
        "rules-2-label": "RPM_LIMIT",
        "rules-2-counts": "requests",
        "rules-2-position": "1",
    }
    assert operator.post(f"/admin/policies/tier/{free().pk}/change/", data).status_code == 302
    added = free().rules.get(type="sliding_window")
    assert (added.params, added.label, added.counts) == ({"limit": 600, "window": 60}, "RPM_LIMIT", "requests")


# --- refusals: on the field they name, once, nothing saved ----------------------------------------


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("0", "capacity: must be greater than 0, got 0 (token_bucket)"),
        ("-5", "capacity: must be greater than 0, got -5 (token_bucket)"),
        ("lots", "capacity: must be a number, not str (token_bucket)"),
        ("nan", "capacity: must be a finite number (token_bucket)"),
        ("", "capacity: is required"),
    ],
)
def test_a_bad_parameter_is_an_error_on_its_own_field_and_nothing_is_saved(operator, loaded, value, reason):
    rules = list(free().rules.all())
    rules[0].params = {"capacity": value, "per_second": 1}
    response, page = post_tier(operator, free(), rules=rules)
    assert response.status_code == 200
    assert reason in param_box(page, "rules-0-", "token_bucket", "capacity")
    assert page.count(reason) == 1
    assert Rule.objects.get(pk=rules[0].pk).params == {"capacity": 10, "per_second": 1}


def test_a_whole_number_parameter_refuses_a_fraction_on_its_field(operator, loaded):
    rules = list(free().rules.all())
    data = tier_form(free(), rules=rules)
    data |= {"rules-1-type": "concurrency", "rules-1-concurrency__limit": "2.5"}
    response = operator.post(f"/admin/policies/tier/{free().pk}/change/", data)
    page = html.unescape(response.content.decode())
    assert "limit: must be a whole number (concurrency)" in param_box(page, "rules-1-", "concurrency", "limit")
    assert Rule.objects.get(pk=rules[1].pk).type == "token_bucket"


def test_a_label_too_long_is_an_error_on_the_label_said_once(operator, loaded):
    rules = list(free().rules.all())
    rules[0].label = "L" * 65
    response, page = post_tier(operator, free(), rules=rules)
    assert response.status_code == 200
    assert page.count("Ensure this value has at most 64 characters (it has 65).") == 1
    assert Rule.objects.get(pk=rules[0].pk).label == ""


def test_a_bad_parameter_and_a_label_too_long_are_both_said_each_on_its_field(operator, loaded):
    rules = list(free().rules.all())
    rules[0].params = {"capacity": 0, "per_second": 1}
    rules[0].label = "L" * 65
    response, page = post_tier(operator, free(), rules=rules)
    assert response.status_code == 200
    assert "capacity: must be greater than 0, got 0 (token_bucket)" in param_box(
        page, "rules-0-", "token_bucket", "capacity"
    )
    label_cell = page[page.index('<td class="field-label">') : page.index('id="id_rules-0-label"')]
    assert "Ensure this value has at most 64 characters (it has 65)." in label_cell
    assert page.count("capacity: must be greater than 0") == 1 and page.count("at most 64 characters") == 1


def test_a_rules_own_page_puts_a_bad_parameter_on_its_field(operator, loaded):
    rule = free().rules.get(level__name="user")
    data = {
        "tier": rule.tier_id,
        "tenant": "",
        "level": rule.level_id,
        "type": "token_bucket",
        **params_data("token_bucket", {"capacity": 10, "per_second": -1}),
        "label": "",
        "counts": "cost",
        "position": 0,
    }
    response = operator.post(f"/admin/policies/rule/{rule.pk}/change/", data)
    page = html.unescape(response.content.decode())
    assert response.status_code == 200
    assert "per_second: must be at least 0, got -1 (token_bucket)" in param_box(page, "", "token_bucket", "per_second")
    assert Rule.objects.get(pk=rule.pk).params == {"capacity": 10, "per_second": 1}


# --- plug-in rule types: JSON, "advanced" ---------------------------------------------------------


def plugin_rule_data(rule, rule_type, params_text):
    return {
        "tier": rule.tier_id,
        "tenant": "",
        "level": rule.level_id,
        "type": rule_type,
        "params": params_text,
        "label": "",
        "counts": "cost",
        "position": 3,
    }


def test_a_plug_in_rules_parameters_are_json_with_its_declared_help(operator, loaded, plugin_rule):
    rule = free().rules.get(level__name="user")
    response = operator.post("/admin/policies/rule/add/", plugin_rule_data(rule, plugin_rule, '{"total": 500}'))
    assert response.status_code == 302
    added = Rule.objects.get(type=plugin_rule)
    assert added.params == {"total": 500}
    page = html.unescape(operator.get(f"/admin/policies/rule/{added.pk}/change/").content.decode())
    advanced = page[page.index('<fieldset class="rule-type-params advanced"') :]
    advanced = advanced[: advanced.index("</fieldset>")]
    assert " hidden" not in advanced.split(">", 1)[0]  # shown: the chosen type is a plug-in
    assert '{"total": 500}' in advanced
    assert re.search(rf'data-rule-type="{plugin_rule}">\s*<b>{plugin_rule}</b> is a plug-in rule type', advanced)
    assert "<code>total</code> (number ≥ 1, required): Cost allowed over the key's lifetime." in advanced


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "Enter a valid JSON, nested at most 64 levels deep."),
        ("[1, 2]", "Must be a mapping of parameter names to values."),
        ('{"total": 0}', "total: must be at least 1, got 0"),
        ('{"totl": 5}', "unknown parameter 'totl' (known: total)"),
        ('{"total": %s}' % ("[" * 64 + "]" * 64), "Enter a valid JSON, nested at most 64 levels deep."),
        (
            "[" * 100_000 + "]" * 100_000,
            "Enter a valid JSON, nested at most 64 levels deep.",
        ),  # past Python's stack: was a 500
    ],
)
def test_a_plug_ins_bad_json_is_an_error_on_its_parameters_not_a_500(operator, loaded, plugin_rule, text, reason):
    rule = free().rules.get(level__name="user")
    response = operator.post("/admin/policies/rule/add/", plugin_rule_data(rule, plugin_rule, text))
    assert response.status_code == 200
    assert reason in html.unescape(response.content.decode())
    assert not Rule.objects.filter(type=plugin_rule).exists()


def test_a_plug_ins_json_box_is_not_read_for_a_built_in_type(operator, loaded):
    rule = free().rules.get(level__name="user")
    data = plugin_rule_data(rule, "token_bucket", "{not json")
    data |= params_data("token_bucket", {"capacity": 77, "per_second": 7})
    response = operator.post(f"/admin/policies/rule/{rule.pk}/change/", data)
    assert response.status_code == 302
    assert Rule.objects.get(pk=rule.pk).params == {"capacity": 77, "per_second": 7}
