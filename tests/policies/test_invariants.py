"""Each invariant of a policy is refused the same way on every path that can break it: the
admin (its pages, its rule page, its delete page and bulk action), the REST API and a policy
file (`loadpolicies`). Each refusal says the same reason, word for word, and changes nothing.
"""

from __future__ import annotations

import html
import io
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import yaml
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from policies.integrity import check_deletable
from policies.invariants import PolicyConflict, PolicyViolation, check_owner_rules
from policies.models import Level, PriorityClass, Rule, Tier
from tests.api.conftest import make_token, memory_engine, token_client  # noqa: F401  (fixtures)

from .test_admin import level_form, params_data, priority_form
from .test_policyfile import snapshot

pytestmark = pytest.mark.django_db

RULE = {"type": "token_bucket", "capacity": 10, "per_second": 1}  # the free tier's user rule
GLOBAL = {"type": "token_bucket", "capacity": 100000, "per_second": 10000}  # the global rule
ONE_BUCKET = "of this level: the same type and parameters are one bucket, whatever the label"


# --- the paths ---------------------------------------------------------------------------------


def rule_row(level: str, spec: dict, **owner) -> Rule:
    """An unsaved rule row, for a page's form."""
    return Rule.from_spec(spec, level=Level.objects.get(name=level), position=0, **owner)


def tier_page(admin: Client, tier: Tier, rules: list[Rule] | None = None, **changes) -> str:
    """Post a tier's change page (its rules inline: stored ones by id, new ones without), as
    the browser would; the page's text."""
    rules = list(tier.rules.all()) if rules is None else rules
    rules.sort(key=lambda rule: rule.pk is None)  # the stored forms first, as the page lists them
    data = {
        "name": tier.name,
        "opened_version": tier.version,
        "rules-TOTAL_FORMS": len(rules),
        "rules-INITIAL_FORMS": sum(rule.pk is not None for rule in rules),
        "rules-MIN_NUM_FORMS": 0,
        "rules-MAX_NUM_FORMS": 1000,
    }
    for i, rule in enumerate(rules):
        data |= {
            f"rules-{i}-id": rule.pk or "",
            f"rules-{i}-tier": tier.pk,
            f"rules-{i}-level": rule.level_id,
            f"rules-{i}-type": rule.type,
            **params_data(rule.type, rule.params, f"rules-{i}-"),
            f"rules-{i}-label": rule.label,
            f"rules-{i}-counts": rule.counts,
            f"rules-{i}-position": rule.position,
        }
    data |= changes
    return text(admin.post(f"/admin/policies/tier/{tier.pk}/change/", data))


def rule_page(admin: Client, rule: Rule) -> str:
    """Add a rule on its own page (the rule admin)."""
    data = {
        "tier": rule.tier_id or "",
        "tenant": rule.tenant_id or "",
        "level": rule.level_id,
        "type": rule.type,
        **params_data(rule.type, rule.params),
        "label": rule.label,
        "counts": rule.counts,
        "position": rule.position,
    }
    return text(admin.post("/admin/policies/rule/add/", data))


def delete_page(admin: Client, row) -> str:
    """Confirm a row's deletion on its delete page."""
    return text(admin.post(f"/admin/policies/{row._meta.model_name}/{row.pk}/delete/", {"post": "yes"}))


def delete_action(admin: Client, *rows) -> str:
    """Confirm the deletion of rows picked in their list (the bulk "delete selected" action)."""
    data = {"action": "delete_selected", "_selected_action": [row.pk for row in rows], "post": "yes"}
    return text(admin.post(f"/admin/policies/{rows[0]._meta.model_name}/", data))


def text(response) -> str:
    assert response.status_code == 200, response.status_code  # the page again, with the refusal
    return html.unescape(response.content.decode())


def tier_put(api, name: str, rules: dict):
    return api.put(f"/api/v1/tiers/{name}", {"name": name, "rules": rules, "version": 1}, format="json")


@dataclass
class Violation:
    """One way to break an invariant, on each path that can: `admin` posts pages and returns
    their texts; `api` returns the response, which names `api_field`; `file` changes the
    policy document, which is refused at `path`. `setup` prepares the store first."""

    reason: str
    admin: Callable[[Client], list[str]] | None = None
    api: Callable | None = None
    status: int = 400
    api_field: str = ""
    file: Callable[[dict], object] | None = None
    path: str = ""
    setup: Callable[[], object] = lambda: None


def free() -> Tier:
    return Tier.objects.get(name="free")


def free_rules(**user_params) -> list[Rule]:
    """The free tier's rules, its user rule's parameters changed."""
    rules = list(free().rules.all())
    for rule in rules:
        if rule.level.name == "user":
            rule.params = {**rule.params, **user_params}
    return rules


def level(name: str) -> Level:
    return Level.objects.get(name=name)


def drop_free_team_rule() -> None:
    Rule.objects.filter(tier__name="free", level__name="team").delete()


def drop_the_global_levels_rules() -> None:
    """Leave the global level used by the batch priority class alone."""
    Rule.objects.filter(level__name="global").delete()


VIOLATIONS = {
    "a parameter out of bounds": Violation(
        reason="must be greater than 0, got -1 (token_bucket)",
        admin=lambda admin: [tier_page(admin, free(), free_rules(capacity=-1))],
        api=lambda api: tier_put(api, "free", {"user": [{**RULE, "capacity": -1}]}),
        api_field="rules.user.0.capacity",
        file=lambda doc: doc["tiers"]["free"]["user"][0].update(capacity=-1),
        path="tiers.free.user[0].capacity",
    ),
    "a label longer than its column": Violation(
        reason="Ensure this value has at most 64 characters (it has 65).",
        admin=lambda admin: [
            tier_page(admin, free(), [*free().rules.all(), rule_row("user", {**RULE, "label": "L" * 65})])
        ],
        api=lambda api: tier_put(api, "free", {"user": [{**RULE, "label": "L" * 65}]}),
        api_field="rules.user.0.label",
        file=lambda doc: doc["tiers"]["free"]["user"][0].update(label="L" * 65),
        path="tiers.free.user[0].label",
    ),
    "a tier without rules": Violation(
        reason="a tier needs at least one rule",
        setup=drop_free_team_rule,
        admin=lambda admin: [
            tier_page(admin, free(), **{"rules-0-DELETE": "on"}),
            delete_page(admin, free().rules.get()),
            delete_action(admin, free().rules.get()),
        ],
        api=lambda api: tier_put(api, "free", {}),
        api_field="rules",
        file=lambda doc: doc["tiers"]["free"].clear(),
        path="tiers.free",
    ),
    "a rule twice at its level": Violation(
        reason=f"repeats rule 0 (token_bucket(10, 1/s)) {ONE_BUCKET}",
        admin=lambda admin: [
            tier_page(admin, free(), [*free().rules.all(), rule_row("user", {**RULE, "label": "AGAIN"})]),
            rule_page(admin, rule_row("user", {**RULE, "label": "AGAIN"}, tier=free())),
        ],
        api=lambda api: tier_put(api, "free", {"user": [RULE, {**RULE, "label": "AGAIN"}]}),
        status=409,
        api_field="rules.user.1",
        file=lambda doc: doc["tiers"]["free"]["user"].append({**RULE, "label": "AGAIN"}),
        path="tiers.free.user[1]",
    ),
    "a rule that repeats a global rule": Violation(
        reason=f"repeats global rule 0 (token_bucket(100000, 10000/s)) {ONE_BUCKET}",
        admin=lambda admin: [
            tier_page(admin, free(), [*free().rules.all(), rule_row("global", GLOBAL)]),
            rule_page(admin, rule_row("global", GLOBAL, tier=free())),
        ],
        api=lambda api: tier_put(api, "free", {"user": [RULE], "global": [GLOBAL]}),
        status=409,
        api_field="rules.global.0",
        file=lambda doc: doc["tiers"]["free"].update({"global": [GLOBAL]}),
        path="tiers.free.global[0]",
    ),
    "a fallback fraction of 0": Violation(
        reason="must be a number above 0 and at most 1",
        admin=lambda admin: [
            text(
                admin.post(
                    f"/admin/policies/level/{level('global').pk}/change/",
                    level_form(level("global"), fallback_fraction=0),
                )
            )
        ],
        api=lambda api: api.patch("/api/v1/levels/global", {"fallback_fraction": 0, "version": 1}, format="json"),
        api_field="fallback_fraction",
        file=lambda doc: doc["levels"][2].update(fallback_fraction=0),
        path="levels[2].fallback_fraction",
    ),
    "a watermark of 1": Violation(
        reason="must be a number from 0 up to (not including) 1",
        admin=lambda admin: [
            text(
                admin.post(
                    f"/admin/policies/priorityclass/{PriorityClass.objects.get(name='batch').pk}/change/",
                    priority_form(PriorityClass.objects.get(name="batch"), watermark=1),
                )
            )
        ],
        api=lambda api: api.patch("/api/v1/priorities/batch", {"watermark": 1, "version": 1}, format="json"),
        api_field="watermark",
        file=lambda doc: doc["priorities"]["batch"].update(watermark=1),
        path="priorities.batch.watermark",
    ),
    "a name with a space": Violation(
        reason="Letters, digits and _ . : - only.",
        admin=lambda admin: [tier_page(admin, free(), name="free tier")],
        api=lambda api: api.patch("/api/v1/tiers/free", {"name": "free tier", "version": 1}, format="json"),
        api_field="name",
        file=lambda doc: doc["tiers"].update({"free tier": doc["tiers"]["free"]}),
        path="tiers.free tier",
    ),
    "a name taken": Violation(
        reason="tier 'pro' already exists",
        admin=lambda admin: [tier_page(admin, free(), name="pro")],
        api=lambda api: api.patch("/api/v1/tiers/free", {"name": "pro", "version": 1}, format="json"),
        status=409,
        api_field="name",
    ),
    "a tenant of an unknown tier": Violation(
        reason="unknown tier 'gold' (known: free, pro)",
        api=lambda api: api.post("/api/v1/tenants", {"key": "initech", "tier": "gold"}, format="json"),
        api_field="tier",
        file=lambda doc: doc["tenants"].update(initech={"tier": "gold"}),
        path="tenants.initech.tier",
    ),
    "a rule at an unknown level": Violation(
        reason="unknown level 'planet' (known: user, team, global)",
        api=lambda api: tier_put(api, "free", {"planet": [RULE]}),
        api_field="rules.planet",
        file=lambda doc: doc["tiers"]["free"].update(planet=[RULE]),
        path="tiers.free.planet",
    ),
    "deleting a level a priority class applies at": Violation(
        reason="level 'global' is used by priority classes batch: take it out of their levels first",
        setup=drop_the_global_levels_rules,
        admin=lambda admin: [delete_page(admin, level("global")), delete_action(admin, level("global"))],
        api=lambda api: api.delete("/api/v1/levels/global"),
        status=409,
        api_field="name",
    ),
    "deleting a level that has rules": Violation(
        reason="level 'team' has 3 rule(s) (tenant bigco, tier free, tier pro): remove them first",
        admin=lambda admin: [delete_page(admin, level("team")), delete_action(admin, level("team"))],
        api=lambda api: api.delete("/api/v1/levels/team"),
        status=409,
        api_field="name",
    ),
    "deleting a tier that has tenants": Violation(
        reason="tier 'pro' is used by tenants acme, bigco: move them to another tier first",
        admin=lambda admin: [
            delete_page(admin, Tier.objects.get(name="pro")),
            delete_action(admin, Tier.objects.get(name="pro")),
        ],
        api=lambda api: api.delete("/api/v1/tiers/pro"),
        status=409,
        api_field="name",
    ),
    "deleting the default tier": Violation(
        reason="tier 'free' is the default tier: choose another default tier first",
        admin=lambda admin: [delete_page(admin, free()), delete_action(admin, free())],
        api=lambda api: api.delete("/api/v1/tiers/free"),
        status=409,
        api_field="name",
    ),
}


@pytest.fixture
def loaded(memory_engine, load, policy):  # noqa: F811
    load(policy)


@pytest.fixture
def admin(loaded):
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("operator", password="pw-for-tests"))
    return client


@pytest.fixture
def api(loaded):
    return token_client(make_token("admin", "ops-script"))


def paths(kind: str) -> list[str]:
    return [name for name, violation in VIOLATIONS.items() if getattr(violation, kind) is not None]


# --- every path refuses it, in the same words ------------------------------------------------------


@pytest.mark.parametrize("name", paths("admin"))
def test_the_admin_refuses_it_with_the_same_reason_and_saves_nothing(admin, name):
    violation = VIOLATIONS[name]
    violation.setup()
    before = snapshot()
    for page in violation.admin(admin):
        assert violation.reason in page
        assert snapshot() == before


@pytest.mark.parametrize("name", paths("api"))
def test_the_api_refuses_it_with_the_same_reason_naming_the_field_and_saves_nothing(api, name):
    violation = VIOLATIONS[name]
    violation.setup()
    before = snapshot()
    response = violation.api(api)
    assert response.status_code == violation.status, response.content
    error = response.json()["error"]
    assert error["code"] == ("conflict" if violation.status == 409 else "invalid")
    assert error["fields"] == {violation.api_field: violation.reason}
    assert snapshot() == before


@pytest.mark.parametrize("name", paths("file"))
def test_loadpolicies_refuses_it_with_the_same_reason_naming_the_field_and_loads_nothing(
    loaded, policy, tmp_path, name
):
    violation = VIOLATIONS[name]
    violation.file(policy)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    before = snapshot()
    with pytest.raises(CommandError) as caught:
        call_command("loadpolicies", str(path), stdout=io.StringIO())
    assert str(caught.value) == f"{path}: {violation.path}: {violation.reason}"
    assert snapshot() == before


# --- the invariants on their own ------------------------------------------------------------------


def test_a_repeat_is_a_conflict_and_a_malformed_rule_is_not():
    with pytest.raises(PolicyConflict):
        check_owner_rules("tenant", {"user": [RULE, RULE]}, {})
    with pytest.raises(PolicyViolation) as caught:
        check_owner_rules("tenant", {"user": [{**RULE, "capacity": 0}]}, {})
    assert not caught.value.conflict and caught.value.path == "user[0].capacity"


def test_a_tenant_may_have_no_overrides_but_a_tier_needs_a_rule():
    check_owner_rules("tenant", {}, {})
    with pytest.raises(PolicyViolation, match="a tier needs at least one rule"):
        check_owner_rules("tier", {"user": []}, {})


def test_an_unused_level_and_tier_may_be_deleted(loaded):
    check_deletable(Level.objects.create(name="org", position=9))
    check_deletable(Tier.objects.create(name="gold"))


def test_a_level_that_priority_classes_use_is_kept_by_the_admin_with_their_levels(admin):
    drop_the_global_levels_rules()
    delete_page(admin, level("global"))
    assert [lv.name for lv in PriorityClass.objects.get(name="batch").levels.all()] == ["global"]


def test_moving_a_tiers_only_rule_to_another_tier_on_its_page_is_refused(admin):
    drop_free_team_rule()
    rule = free().rules.get()
    data = {
        "tier": Tier.objects.get(name="pro").pk,
        "tenant": "",
        "level": rule.level_id,
        "type": "token_bucket",
        **params_data("token_bucket", {"capacity": 3, "per_second": 1}),
        "label": "",
        "counts": "cost",
        "position": 5,
    }
    page = text(admin.post(f"/admin/policies/rule/{rule.pk}/change/", data))
    assert "tiers.free: a tier needs at least one rule" in page
    assert Rule.objects.get(pk=rule.pk).tier.name == "free"


def test_a_rule_page_checks_a_tiers_rule_with_its_own_tier_only(admin):
    # The pro tier's user rule may equal a rule of the free tier: they are different tiers.
    pro_user = Tier.objects.get(name="pro").rules.filter(level__name="user").first()
    data = {
        "tier": pro_user.tier_id,
        "tenant": "",
        "level": pro_user.level_id,
        "type": "token_bucket",
        **params_data("token_bucket", {"capacity": 10, "per_second": 1}),
        "label": "",
        "counts": "cost",
        "position": pro_user.position,
    }
    response = admin.post(f"/admin/policies/rule/{pro_user.pk}/change/", data)
    assert response.status_code == 302
    assert Rule.objects.get(pk=pro_user.pk).params == {"capacity": 10, "per_second": 1}
