"""The admin console: rules inline with their parameters' help, tenant search and filters,
optimistic locking on tiers, tenants, levels and priority classes, and the audit trail."""

import json

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model

from policies.admin.rule_form import field_name, is_typed
from policies.models import Level, PolicySettings, PolicyVersion, PriorityClass, Rule, Tenant, Tier

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client):
    user = get_user_model().objects.create_superuser("operator", password="pw-for-tests")
    client.force_login(user)
    return user


@pytest.fixture
def loaded(load, policy):
    load(policy)


def params_data(rule_type, params, prefix=""):
    """A rule's parameters as its form posts them: a field per parameter of a typed rule type
    (`token_bucket__capacity`), JSON for a plug-in's."""
    if is_typed(rule_type):
        return {prefix + field_name(rule_type, name): value for name, value in params.items()}
    return {prefix + "params": json.dumps(params)}


def tier_form(tier, version=None, rules=None, **changes):
    """The POST of a tier's change page, as the browser would send it."""
    rules = list(tier.rules.all()) if rules is None else rules
    data = {
        "name": tier.name,
        "opened_version": tier.version if version is None else version,
        "rules-TOTAL_FORMS": len(rules),
        "rules-INITIAL_FORMS": len(rules),
        "rules-MIN_NUM_FORMS": 0,
        "rules-MAX_NUM_FORMS": 1000,
    }
    for i, rule in enumerate(rules):
        data |= {
            f"rules-{i}-id": rule.pk,
            f"rules-{i}-tier": tier.pk,
            f"rules-{i}-level": rule.level_id,
            f"rules-{i}-type": rule.type,
            **params_data(rule.type, rule.params, f"rules-{i}-"),
            f"rules-{i}-label": rule.label,
            f"rules-{i}-counts": rule.counts,
            f"rules-{i}-position": rule.position,
        }
        if rule.shadow:
            data[f"rules-{i}-shadow"] = "on"
    data.update(changes)
    return data


def test_every_model_is_registered():
    for model in (Level, Tier, Tenant, Rule, PriorityClass, PolicySettings, PolicyVersion):
        assert admin.site.is_registered(model)


def test_the_tier_page_shows_its_rules_with_each_parameters_help(client, operator, loaded):
    pro = Tier.objects.get(name="pro")
    page = client.get(f"/admin/policies/tier/{pro.pk}/change/").content.decode()
    assert "Most tokens the bucket holds: the largest burst." in page  # token_bucket's capacity
    assert "Length of the window in seconds." in page  # sliding_window's window
    assert 'name="opened_version"' in page and 'type="hidden"' in page
    assert "RPM_LIMIT" in page


def test_the_tenant_page_shows_its_overrides_inline(client, operator, loaded):
    bigco = Tenant.objects.get(key="bigco")
    page = client.get(f"/admin/policies/tenant/{bigco.pk}/change/").content.decode()
    assert "replace the tier" in page and "600" in page


def test_a_save_with_the_version_it_was_opened_at_goes_through(client, operator, loaded):
    pro = Tier.objects.get(name="pro")
    rules = list(pro.rules.all())
    rules[0].params = {**rules[0].params, "limit": 900}
    response = client.post(f"/admin/policies/tier/{pro.pk}/change/", tier_form(pro, rules=rules))
    assert response.status_code == 302
    assert Tier.objects.get(pk=pro.pk).version == pro.version + 1
    assert Rule.objects.get(pk=rules[0].pk).params["limit"] == 900


def test_a_save_of_a_tier_changed_since_it_was_opened_is_refused(client, operator, loaded, commits):
    pro = Tier.objects.get(name="pro")
    opened = tier_form(pro)  # the page as it was opened
    someone_else = Tier.objects.get(pk=pro.pk)
    someone_else.name = "professional"
    someone_else.save()

    opened["name"] = "pro-plus"
    response = client.post(f"/admin/policies/tier/{pro.pk}/change/", opened)

    assert response.status_code == 200
    assert "changed since you opened it" in response.content.decode()
    assert Tier.objects.get(pk=pro.pk).name == "professional"


def test_a_save_of_a_tenant_changed_since_it_was_opened_is_refused(client, operator, loaded):
    acme = Tenant.objects.get(key="acme")
    free = Tier.objects.get(name="free")
    form = {
        "key": "acme",
        "tier": free.pk,
        "overrides_until": "",
        "opened_version": acme.version,
        "rules-TOTAL_FORMS": 0,
        "rules-INITIAL_FORMS": 0,
        "rules-MIN_NUM_FORMS": 0,
        "rules-MAX_NUM_FORMS": 1000,
    }
    acme.overrides_until = None
    acme.save()  # someone else saved meanwhile

    response = client.post(f"/admin/policies/tenant/{acme.pk}/change/", form)

    assert "changed since you opened it" in response.content.decode()
    assert Tenant.objects.get(pk=acme.pk).tier.name == "pro"


def level_form(level, **changes):
    """The POST of a level's change page, as it was opened."""
    return {
        "name": level.name,
        "position": level.position,
        "fail_mode": level.fail_mode,
        "fallback_fraction": level.fallback_fraction,
        "opened_version": level.version,
        **changes,
    }


def priority_form(priority, **changes):
    """The POST of a priority class's change page, as it was opened."""
    return {
        "name": priority.name,
        "watermark": priority.watermark,
        "levels": [level.pk for level in priority.levels.all()],
        "opened_version": priority.version,
        **changes,
    }


def test_a_level_and_a_priority_page_carry_the_version_they_were_opened_at(client, operator, loaded):
    for url in (
        f"/admin/policies/level/{Level.objects.get(name='team').pk}/change/",
        f"/admin/policies/priorityclass/{PriorityClass.objects.get(name='batch').pk}/change/",
    ):
        page = client.get(url).content.decode()
        assert '<input type="hidden" name="opened_version" value="1"' in page, url


def test_a_level_saved_with_the_version_it_was_opened_at_goes_through(client, operator, loaded):
    team = Level.objects.get(name="team")
    response = client.post(f"/admin/policies/level/{team.pk}/change/", level_form(team, fail_mode="closed"))
    assert response.status_code == 302
    assert Level.objects.filter(pk=team.pk).values_list("fail_mode", "version").get() == ("closed", 2)


def test_a_save_of_a_level_changed_since_it_was_opened_is_refused(client, operator, loaded):
    team = Level.objects.get(name="team")
    opened = level_form(team, fail_mode="closed")
    someone_else = Level.objects.get(pk=team.pk)
    someone_else.fallback_fraction = 0.5
    someone_else.save()

    response = client.post(f"/admin/policies/level/{team.pk}/change/", opened)

    assert response.status_code == 200
    assert "This level changed since you opened it" in response.content.decode()
    assert Level.objects.filter(pk=team.pk).values_list("fail_mode", "fallback_fraction", "version").get() == (
        "open",
        0.5,
        2,
    )


def test_a_save_of_a_priority_class_changed_since_it_was_opened_is_refused(client, operator, loaded):
    batch = PriorityClass.objects.get(name="batch")
    opened = priority_form(batch, watermark=0.5)
    someone_else = PriorityClass.objects.get(pk=batch.pk)
    someone_else.save()
    someone_else.levels.set([Level.objects.get(name="team")])

    response = client.post(f"/admin/policies/priorityclass/{batch.pk}/change/", opened)

    assert response.status_code == 200
    assert "This priority class changed since you opened it" in response.content.decode()
    batch = PriorityClass.objects.get(pk=batch.pk)
    assert (batch.watermark, batch.version, [level.name for level in batch.levels.all()]) == (0.2, 2, ["team"])


def test_a_load_that_changes_only_a_priority_class_levels_makes_its_open_page_stale(client, operator, load, policy):
    load(policy)
    batch = PriorityClass.objects.get(name="batch")
    opened = priority_form(batch, watermark=0.5)
    policy["priorities"]["batch"]["levels"] = ["team"]
    load(policy)

    response = client.post(f"/admin/policies/priorityclass/{batch.pk}/change/", opened)

    assert "changed since you opened it" in response.content.decode()
    assert PriorityClass.objects.get(pk=batch.pk).watermark == 0.2


def test_levels_are_not_edited_in_their_list_which_carries_no_version(client, operator, loaded):
    page = client.get("/admin/policies/level/").content.decode()
    assert "user" in page and 'name="form-0-position"' not in page


def test_a_stale_copy_saved_in_code_is_refused_too(loaded):
    from policies.models import StaleVersion

    first, second = Tier.objects.get(name="pro"), Tier.objects.get(name="pro")
    first.save()
    with pytest.raises(StaleVersion, match="changed since you opened it"):
        second.save()


def test_a_tier_with_no_rules_is_refused(client, operator, loaded):
    free = Tier.objects.get(name="free")
    data = tier_form(free)
    data |= {"rules-0-DELETE": "on", "rules-1-DELETE": "on"}
    response = client.post(f"/admin/policies/tier/{free.pk}/change/", data)
    assert "a tier needs at least one rule" in response.content.decode()
    assert free.rules.count() == 2


def test_a_bad_parameter_is_refused_on_the_inline_naming_it(client, operator, loaded):
    free = Tier.objects.get(name="free")
    rules = list(free.rules.all())
    rules[0].params = {"capacity": "lots", "per_second": 1}
    response = client.post(f"/admin/policies/tier/{free.pk}/change/", tier_form(free, rules=rules))
    assert "capacity: must be a number, not str" in response.content.decode()


def test_a_rule_that_repeats_a_global_rule_is_refused(client, operator, loaded):
    free = Tier.objects.get(name="free")
    rules = list(free.rules.all())
    rules[0].level = Level.objects.get(name="global")
    rules[0].params = {"capacity": 100000, "per_second": 10000}
    response = client.post(f"/admin/policies/tier/{free.pk}/change/", tier_form(free, rules=rules))
    assert "global[0]: repeats global rule 0 (token_bucket(100000, 10000/s)) of this level" in response.content.decode()
    assert not Rule.objects.filter(tier=free, level__name="global").exists()


def test_tenants_can_be_searched_and_filtered(client, operator, loaded):
    pro = Tier.objects.get(name="pro")
    page = client.get("/admin/policies/tenant/", {"q": "big"}).content.decode()
    assert "bigco" in page and "acme" not in page
    page = client.get("/admin/policies/tenant/", {"overrides": "yes"}).content.decode()
    assert "bigco" in page and "acme" not in page
    page = client.get("/admin/policies/tenant/", {"overrides": "no", "tier__id__exact": pro.pk}).content.decode()
    assert "acme" in page and "bigco" not in page
    assert client.get("/admin/policies/tenant/", {"overrides": "active"}).status_code == 200


def test_every_changelist_and_add_page_renders(client, operator, loaded):
    for model in ("level", "tier", "tenant", "rule", "priorityclass", "policysettings", "policyversion"):
        assert client.get(f"/admin/policies/{model}/").status_code == 200, model
    for model in ("level", "tier", "tenant", "rule", "priorityclass"):
        assert client.get(f"/admin/policies/{model}/add/").status_code == 200, model


def test_changes_are_recorded_with_the_operator_and_shown_in_the_history(client, operator, loaded):
    pro = Tier.objects.get(name="pro")
    assert pro.history.count() == 1  # created by the load
    client.post(f"/admin/policies/tier/{pro.pk}/change/", tier_form(pro, name="pro2"))

    latest = Tier.objects.get(pk=pro.pk).history.first()
    assert (latest.name, latest.history_type, latest.history_user) == ("pro2", "~", operator)
    page = client.get(f"/admin/policies/tier/{pro.pk}/history/").content.decode()
    assert "pro2" in page and "operator" in page


def test_rule_and_tenant_changes_are_audited(loaded):
    rule = Rule.objects.filter(tier__name="pro").first()
    rule.label = "NEW_LABEL"
    rule.save()
    assert rule.history.first().label == "NEW_LABEL"
    tenant = Tenant.objects.get(key="acme")
    tenant.delete()
    assert Tenant.history.filter(key="acme", history_type="-").exists()


def test_a_save_that_loses_the_race_after_the_check_is_rolled_back_not_a_500(client, operator, loaded, monkeypatch):
    from policies.admin import VersionedForm

    pro = Tier.objects.get(name="pro")
    real_clean = VersionedForm.clean

    def someone_saves_right_after_the_check(form):
        data = real_clean(form)
        Tier.objects.filter(pk=pro.pk).update(version=pro.version + 5)  # another save lands here
        return data

    monkeypatch.setattr(VersionedForm, "clean", someone_saves_right_after_the_check)
    response = client.post(f"/admin/policies/tier/{pro.pk}/change/", tier_form(pro, name="renamed"), follow=True)

    assert "changed since you opened it" in response.content.decode()
    assert Tier.objects.get(pk=pro.pk).name == "pro"


def test_a_rule_saved_on_its_own_page_makes_an_open_tier_page_stale(client, operator, loaded):
    pro = Tier.objects.get(name="pro")
    opened = tier_form(pro)  # the tier page as it was opened
    rule = pro.rules.first()
    response = client.post(
        f"/admin/policies/rule/{rule.pk}/change/",
        {
            "tier": pro.pk,
            "tenant": "",
            "level": rule.level_id,
            "type": rule.type,
            **params_data(rule.type, {**rule.params, "limit": 700}),
            "label": rule.label,
            "counts": rule.counts,
            "position": rule.position,
        },
    )
    assert response.status_code == 302
    assert Tier.objects.get(pk=pro.pk).version == pro.version + 1

    response = client.post(f"/admin/policies/tier/{pro.pk}/change/", opened)
    assert response.status_code == 200
    assert "changed since you opened it" in response.content.decode()
    assert Rule.objects.get(pk=rule.pk).params["limit"] == 700


def test_a_global_rule_that_repeats_a_tiers_rule_is_refused_on_the_rule_page(client, operator, loaded):
    pro_team = Tier.objects.get(name="pro").rules.get(level__name="team")
    response = client.post(
        "/admin/policies/rule/add/",
        {
            "tier": "",
            "tenant": "",
            "level": pro_team.level_id,
            "type": pro_team.type,
            **params_data(pro_team.type, pro_team.params),
            "label": "",
            "counts": "cost",
            "position": 0,
        },
    )
    assert response.status_code == 200
    assert "tiers.pro.team[0]: repeats global rule 0 (token_bucket(1000, 100/s)) of this level" in (
        response.content.decode()
    )
    assert not Rule.objects.filter(tier=None, tenant=None, level=pro_team.level_id).exists()


def test_params_that_are_not_a_mapping_are_a_form_error_on_the_rule_page_not_a_500(
    client, operator, loaded, plugin_rule
):
    rule = Tier.objects.get(name="free").rules.first()
    data = {
        "tier": rule.tier_id,
        "tenant": "",
        "level": rule.level_id,
        "type": plugin_rule,  # a plug-in's parameters are JSON
        "params": json.dumps([1, 2]),
        "label": "",
        "counts": "cost",
        "position": 0,
    }
    response = client.post(f"/admin/policies/rule/{rule.pk}/change/", data)
    assert response.status_code == 200
    assert "Must be a mapping of parameter names to values." in response.content.decode()
    assert Rule.objects.get(pk=rule.pk).params == rule.params


# --- service tokens ----------------------------------------------------------------------------


@pytest.fixture
def tokens():
    """Two tokens as `manage.py createservicetoken` makes them: {name: (row, token)}."""
    from policies.tokens import issue_token

    return {"gateway": issue_token("gateway", "decide"), "ops-script": issue_token("ops-script", "admin")}


def test_service_tokens_are_listed_without_their_digest(client, operator, tokens):
    page = client.get("/admin/policies/servicetoken/").content.decode()
    for row, token in tokens.values():
        assert row.name in page and row.prefix in page
        assert row.digest not in page and token not in page
    assert "decide" in page and "admin" in page
    assert "createservicetoken" in page  # where tokens come from

    row, token = tokens["gateway"]
    page = client.get(f"/admin/policies/servicetoken/{row.pk}/change/").content.decode()
    assert row.prefix in page and row.digest not in page and "digest" not in page


def test_a_token_cannot_be_made_from_the_admin(client, operator):
    from policies.models import ServiceToken

    assert admin.site.is_registered(ServiceToken)
    assert client.get("/admin/policies/servicetoken/add/").status_code == 403
    assert "/admin/policies/servicetoken/add/" not in client.get("/admin/policies/servicetoken/").content.decode()


def test_revoking_selected_tokens_stops_them_at_once(client, operator, tokens):
    from policies.models import ServiceToken
    from policies.tokens import find_token

    gateway, gateway_token = tokens["gateway"]
    script, script_token = tokens["ops-script"]
    assert find_token(gateway_token) is not None  # and now cached in this process

    response = client.post(
        "/admin/policies/servicetoken/", {"action": "revoke", "_selected_action": [gateway.pk]}, follow=True
    )

    assert "Revoked 1 token(s)" in response.content.decode()
    assert ServiceToken.objects.get(pk=gateway.pk).revoked_at is not None
    assert find_token(gateway_token) is None
    assert find_token(script_token) is not None and ServiceToken.objects.get(pk=script.pk).revoked_at is None


def test_revoking_a_revoked_token_keeps_when_it_was_revoked(client, operator, tokens):
    from policies.models import ServiceToken

    gateway, _ = tokens["gateway"]
    client.post("/admin/policies/servicetoken/", {"action": "revoke", "_selected_action": [gateway.pk]})
    first = ServiceToken.objects.get(pk=gateway.pk).revoked_at
    response = client.post(
        "/admin/policies/servicetoken/", {"action": "revoke", "_selected_action": [gateway.pk]}, follow=True
    )
    assert "Revoked 0 token(s)" in response.content.decode()
    assert ServiceToken.objects.get(pk=gateway.pk).revoked_at == first


def test_a_tokens_page_can_rename_it_but_not_widen_its_scope_or_unrevoke_it(client, operator, tokens):
    from policies.models import ServiceToken

    gateway, _ = tokens["gateway"]
    url = f"/admin/policies/servicetoken/{gateway.pk}/change/"
    response = client.post(url, {"name": "edge-gateway", "scope": "admin", "revoked_at_0": "", "revoked_at_1": ""})
    assert response.status_code == 302
    row = ServiceToken.objects.get(pk=gateway.pk)
    assert (row.name, row.scope) == ("edge-gateway", "decide")

    client.post("/admin/policies/servicetoken/", {"action": "revoke", "_selected_action": [gateway.pk]})
    client.post(url, {"name": "edge-gateway", "revoked_at_0": "", "revoked_at_1": ""})
    assert ServiceToken.objects.get(pk=gateway.pk).revoked
