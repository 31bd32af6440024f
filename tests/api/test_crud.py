"""The operators' policy CRUD: /api/v1/tiers, /tenants, /levels, /priorities and /settings,
over Django's full request stack, with SPEC.md's example policy loaded."""

import secrets

import pytest
from django.db import DatabaseError
from django.utils import timezone

from policies.api.serializers import LevelSerializer, TierSerializer
from policies.compile import CHECK_EVERY
from policies.models import Level, PolicySettings, PriorityClass, Rule, Tenant, Tier
from policies.signals import current_version

from .conftest import make_token, token_client

PRO_RULES = {
    "user": [
        {"type": "sliding_window", "limit": 600, "window": 60, "label": "RPM_LIMIT"},
        {"type": "token_bucket", "capacity": 50, "per_second": 10, "label": "BURST_LIMIT"},
    ],
    "team": [{"type": "token_bucket", "capacity": 1000, "per_second": 100}],
}


@pytest.fixture
def loaded(memory_engine, load, policy_doc):
    """SPEC.md's example policy, loaded, deciding on the in-process store."""
    load(policy_doc)
    return memory_engine


@pytest.fixture
def client(loaded, admin_api_client):
    """An operator's script: an admin-scope token."""
    return admin_api_client


@pytest.fixture
def committed(django_capture_on_commit_callbacks):
    """Run what the block commits' hooks, as a real commit would (the policy version moves)."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


def error_of(response, status):
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "fields"}
    return body["error"]


def snapshot():
    """Every policy row, to show a refused write changed nothing."""
    return {
        "tiers": list(Tier.objects.values_list("name", "version")),
        "tenants": list(Tenant.objects.values_list("key", "tier__name", "overrides_until", "version")),
        "rules": sorted(Rule.objects.values_list("id", "tier_id", "tenant_id", "level_id", "type", "position")),
        "params": sorted((r.id, sorted(r.params.items())) for r in Rule.objects.all()),
        "levels": list(Level.objects.values_list("name", "position", "fail_mode", "fallback_fraction", "version")),
        "priorities": list(PriorityClass.objects.values_list("name", "watermark", "levels__name", "version")),
        "version": current_version(),
    }


def pro(client):
    return client.get("/api/v1/tiers/pro").json()


# --- tiers ------------------------------------------------------------------------------


def test_tiers_are_listed_by_name_with_their_rules_by_level(client):
    body = client.get("/api/v1/tiers").json()
    assert body["count"] == 2
    assert [tier["name"] for tier in body["results"]] == ["free", "pro"]
    assert body["results"][1]["rules"] == PRO_RULES


def test_a_tier_reads_as_the_policy_file_spells_it(client):
    response = client.get("/api/v1/tiers/pro")
    assert response.status_code == 200
    assert response.json() == {"name": "pro", "rules": PRO_RULES, "version": 1}


def test_an_unknown_tier_is_a_404_in_the_error_shape(client):
    error = error_of(client.get("/api/v1/tiers/gold"), 404)
    assert error["code"] == "not_found" and "gold" in error["message"]


def test_a_tier_is_created_with_its_rules(client, committed):
    rules = {
        "user": [{"type": "gcra", "rate": 5, "burst": 10, "shadow": True}],
        "team": [{"type": "fixed_window", "limit": 100, "window": 60, "counts": "requests"}],
    }
    before = current_version()
    with committed():
        response = client.post("/api/v1/tiers", {"name": "gold", "rules": rules}, format="json")
    assert response.status_code == 201, response.content
    assert response.json() == {"name": "gold", "rules": rules, "version": 1}
    assert response["Location"] == "/api/v1/tiers/gold"
    assert Tier.objects.get(name="gold").rules.count() == 2
    assert current_version() == before + 1
    assert client.get("/api/v1/tiers/gold").json()["rules"] == rules


def test_a_tier_name_that_exists_already_is_a_409(client):
    before = snapshot()
    error = error_of(client.post("/api/v1/tiers", {"name": "pro", "rules": PRO_RULES}, format="json"), 409)
    assert error["code"] == "conflict" and "name" in error["fields"]
    assert snapshot() == before


def test_put_replaces_a_tiers_rules_and_moves_its_version(client, committed):
    rules = {"user": [{"type": "token_bucket", "capacity": 70, "per_second": 7}]}
    before = current_version()
    with committed():
        response = client.put("/api/v1/tiers/pro", {"name": "pro", "rules": rules, "version": 1}, format="json")
    assert response.status_code == 200, response.content
    assert response.json() == {"name": "pro", "rules": rules, "version": 2}
    assert list(Rule.objects.filter(tier__name="pro").values_list("type", "params")) == [
        ("token_bucket", {"capacity": 70, "per_second": 7})
    ]
    assert current_version() == before + 1


def test_put_can_rename_a_tier_and_its_tenants_follow(client):
    body = {**pro(client), "name": "professional"}
    response = client.put("/api/v1/tiers/pro", body, format="json")
    assert response.status_code == 200
    assert client.get("/api/v1/tiers/pro").status_code == 404
    assert client.get("/api/v1/tenants/acme").json()["tier"] == "professional"


def test_patch_replaces_only_the_levels_it_names(client):
    team = [{"type": "token_bucket", "capacity": 2000, "per_second": 200}]
    response = client.patch("/api/v1/tiers/pro", {"rules": {"team": team}, "version": 1}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["rules"] == {"user": PRO_RULES["user"], "team": team}

    response = client.patch("/api/v1/tiers/pro", {"rules": {"team": None}, "version": 2}, format="json")
    assert response.json()["rules"] == {"user": PRO_RULES["user"]}
    assert response.json()["version"] == 3


def test_a_write_that_changes_no_rule_leaves_the_rules_rows_alone(client):
    ids = set(Rule.objects.filter(tier__name="pro").values_list("id", flat=True))
    response = client.put("/api/v1/tiers/pro", pro(client), format="json")
    assert response.status_code == 200 and response.json()["version"] == 2
    assert set(Rule.objects.filter(tier__name="pro").values_list("id", flat=True)) == ids


def test_a_stale_version_is_a_409_and_changes_nothing(client):
    read = pro(client)
    assert (
        client.patch("/api/v1/tiers/pro", {"rules": {"team": None}, "version": 1}, format="json").status_code == 200
    )  # someone else's change
    before = snapshot()
    error = error_of(client.put("/api/v1/tiers/pro", {**read, "name": "pro2"}, format="json"), 409)
    assert error["code"] == "conflict"
    assert "version" in error["fields"] and "version 2, you sent 1" in error["message"]
    assert snapshot() == before


def test_a_write_that_loses_the_race_after_the_check_is_a_409_not_a_500(client, monkeypatch):
    real = TierSerializer.validate

    def someone_saves_right_after_the_check(serializer, attrs):
        checked = real(serializer, attrs)
        Tier.objects.filter(name="pro").update(version=7)  # another save lands here
        return checked

    monkeypatch.setattr(TierSerializer, "validate", someone_saves_right_after_the_check)
    rules = {"user": [{"type": "token_bucket", "capacity": 1, "per_second": 1}]}
    error = error_of(client.put("/api/v1/tiers/pro", {"name": "pro", "rules": rules, "version": 1}, format="json"), 409)
    assert "changed since" in error["message"]
    assert Tier.objects.get(name="pro").rules.count() == 3


# Every versioned kind: a row of it, and a new one for its collection.
VERSIONED = {
    "tier": ("/api/v1/tiers/pro", {"name": "gold", "rules": PRO_RULES}),
    "tenant": ("/api/v1/tenants/acme", {"key": "initech", "tier": "free"}),
    "level": ("/api/v1/levels/user", {"name": "org"}),
    "priority class": ("/api/v1/priorities/batch", {"name": "bulk"}),
}


@pytest.mark.parametrize("method", ["put", "patch"])
@pytest.mark.parametrize("kind", VERSIONED)
def test_a_write_without_the_version_is_a_400(client, method, kind):
    url = VERSIONED[kind][0]
    body = {key: value for key, value in client.get(url).json().items() if key != "version"}
    before = snapshot()
    error = error_of(getattr(client, method)(url, body, format="json"), 400)
    assert list(error["fields"]) == ["version"] and "required" in error["fields"]["version"]
    assert snapshot() == before


@pytest.mark.parametrize("kind", VERSIONED)
def test_a_version_sent_when_creating_is_refused(client, kind):
    url, new = VERSIONED[kind]
    before = snapshot()
    error = error_of(client.post(url.rsplit("/", 1)[0], {**new, "version": 5}, format="json"), 400)
    assert list(error["fields"]) == ["version"] and "read-only" in error["fields"]["version"]
    assert snapshot() == before


@pytest.mark.parametrize("field", ["id", "pk", "tier_id", "created_at", "tenants", "history", "Name"])
def test_fields_the_api_does_not_take_are_refused_by_name(client, field):
    before = snapshot()
    error = error_of(client.patch("/api/v1/tiers/pro", {"version": 1, field: 99}, format="json"), 400)
    assert list(error["fields"]) == [field] and "unknown field" in error["fields"][field]
    assert snapshot() == before


def test_put_must_send_every_field_so_nothing_is_reset_by_omission(client):
    error = error_of(client.put("/api/v1/tiers/pro", {"name": "pro", "version": 1}, format="json"), 400)
    assert "rules" in error["fields"] and "PATCH" in error["fields"]["rules"]


BAD_RULES = [
    (
        {"user": [{"type": "token_bucket", "capacity": "lots", "per_second": 1}]},
        "rules.user.0.capacity",
        "must be a number",
    ),
    (
        {
            "user": [
                {"type": "token_bucket", "capacity": 5, "per_second": 1},
                {"type": "token_bucket", "capacity": -1, "per_second": 1},
            ]
        },
        "rules.user.1.capacity",
        "greater than 0",
    ),
    ({"user": [{"type": "token_bucket", "capacity": 5}]}, "rules.user.0.per_second", "required"),
    ({"user": [{"type": "leaky", "capacity": 5}]}, "rules.user.0.type", "unknown rule type"),
    (
        {"user": [{"type": "token_bucket", "capacity": 5, "per_second": 1, "burst": 3}]},
        "rules.user.0",
        "unknown parameter 'burst'",
    ),
    (
        {"user": [{"type": "token_bucket", "capacity": 5, "per_second": 1, "label": "L" * 65}]},
        "rules.user.0.label",
        "at most 64",
    ),
    (
        {"user": [{"type": "token_bucket", "capacity": 5, "per_second": 1, "shadow": "yes"}]},
        "rules.user.0.shadow",
        "true or false",
    ),
    (
        {"user": [{"type": "token_bucket", "capacity": 5, "per_second": 1, "counts": "bytes"}]},
        "rules.user.0.counts",
        "cost",
    ),
    ({"user": ["token_bucket"]}, "rules.user.0", "mapping"),
    ({"user": {"type": "token_bucket"}}, "rules.user", "list of rules"),
    ({"planet": [{"type": "token_bucket", "capacity": 5, "per_second": 1}]}, "rules.planet", "unknown level"),
    ({}, "rules", "at least one rule"),
    ({"user": [], "team": None}, "rules", "at least one rule"),
    ([PRO_RULES["team"]], "rules", "must be an object"),
]


@pytest.mark.parametrize("rules, path, message", BAD_RULES)
def test_a_bad_rule_is_a_400_naming_its_path_and_changes_nothing(client, rules, path, message):
    before = snapshot()
    error = error_of(client.put("/api/v1/tiers/pro", {"name": "pro", "rules": rules, "version": 1}, format="json"), 400)
    assert error["code"] == "invalid"
    assert list(error["fields"]) == [path], error
    assert message in error["fields"][path]
    assert error["message"].startswith(path)
    assert snapshot() == before


# The same type and parameters are one bucket: a repeat is taken, as a name can be (a 409).
REPEATED_RULES = [
    (
        {
            "user": [
                {"type": "token_bucket", "capacity": 5, "per_second": 1},
                {"type": "token_bucket", "capacity": 5, "per_second": 1, "label": "AGAIN"},
            ]
        },
        "rules.user.1",
        "repeats rule 0",
    ),
    (
        {"user": [{"type": "concurrency", "limit": 1}, {"type": "concurrency", "limit": 1, "lease": 60}]},
        "rules.user.1",
        "repeats rule 0",
    ),
    (
        {"global": [{"type": "token_bucket", "capacity": 100000, "per_second": 10000}]},
        "rules.global.0",
        "repeats global rule 0",
    ),
]


@pytest.mark.parametrize("rules, path, message", REPEATED_RULES)
def test_a_rule_that_repeats_another_at_its_level_is_a_409_naming_its_path_and_changes_nothing(
    client, rules, path, message
):
    before = snapshot()
    error = error_of(client.put("/api/v1/tiers/pro", {"name": "pro", "rules": rules, "version": 1}, format="json"), 409)
    assert error["code"] == "conflict"
    assert list(error["fields"]) == [path], error
    assert message in error["fields"][path]
    assert snapshot() == before


def test_a_bad_rule_creates_no_tier_and_no_rule(client):
    before = snapshot()
    rules = {
        "user": [{"type": "token_bucket", "capacity": 5, "per_second": 1}],
        "team": [{"type": "token_bucket", "capacity": 5, "per_second": -2}],
    }
    error = error_of(client.post("/api/v1/tiers", {"name": "gold", "rules": rules}, format="json"), 400)
    assert list(error["fields"]) == ["rules.team.0.per_second"]
    assert snapshot() == before


def test_a_database_failure_in_the_middle_of_a_write_leaves_nothing_half_saved(client, monkeypatch):
    before = snapshot()
    real_save = Rule.save
    saved = []

    def second_save_fails(rule, *args, **kwargs):
        saved.append(rule)
        if len(saved) == 2:
            raise DatabaseError("disk full")
        return real_save(rule, *args, **kwargs)

    monkeypatch.setattr(Rule, "save", second_save_fails)
    rules = {
        "user": [{"type": "token_bucket", "capacity": 1, "per_second": 1}],
        "team": [{"type": "token_bucket", "capacity": 2, "per_second": 1}],
    }
    error = error_of(
        client.put("/api/v1/tiers/pro", {"name": "renamed", "rules": rules, "version": 1}, format="json"), 503
    )
    assert error["code"] == "database_unavailable"
    assert len(saved) == 2  # the tier and its first new rule were written, then rolled back
    assert snapshot() == before


def test_a_tier_still_used_by_tenants_cannot_be_deleted(client):
    error = error_of(client.delete("/api/v1/tiers/pro"), 409)
    assert error["code"] == "conflict"
    assert "used by tenants acme, bigco" in error["message"]
    assert Tier.objects.filter(name="pro").exists()


def test_the_default_tier_cannot_be_deleted(client):
    error = error_of(client.delete("/api/v1/tiers/free"), 409)
    assert "default tier" in error["message"]
    assert Tier.objects.filter(name="free").exists()


def test_an_unused_tier_is_deleted_with_its_rules(client, committed):
    with committed():
        client.post("/api/v1/tiers", {"name": "gold", "rules": {"user": PRO_RULES["team"]}}, format="json")
    before = current_version()
    with committed():
        response = client.delete("/api/v1/tiers/gold")
    assert response.status_code == 204
    assert not Tier.objects.filter(name="gold").exists()
    assert not Rule.objects.filter(tier__name="gold").exists()
    assert current_version() == before + 1


def test_lists_take_a_limit_and_an_offset(client):
    body = client.get("/api/v1/tiers", {"limit": 1, "offset": 1}).json()
    assert body["count"] == 2 and [tier["name"] for tier in body["results"]] == ["pro"]
    assert body["previous"] is not None and body["next"] is None


# --- tenants ---------------------------------------------------------------------------------


def test_tenants_are_listed_by_key_and_filtered_by_tier(client):
    client.post("/api/v1/tenants", {"key": "zeta", "tier": "free"}, format="json")
    assert [t["key"] for t in client.get("/api/v1/tenants").json()["results"]] == ["acme", "bigco", "zeta"]
    assert [t["key"] for t in client.get("/api/v1/tenants", {"tier": "free"}).json()["results"]] == ["zeta"]


def test_a_tenant_reads_with_its_overrides_and_their_expiry(client):
    assert client.get("/api/v1/tenants/bigco").json() == {
        "key": "bigco",
        "tier": "pro",
        "overrides": {"team": [{"type": "token_bucket", "capacity": 600, "per_second": 10}]},
        "overrides_until": "2026-12-31T00:00:00Z",
        "version": 1,
    }
    assert client.get("/api/v1/tenants/acme").json()["overrides"] == {}


def test_a_tenant_is_created_with_overrides(client, committed):
    overrides = {"user": [{"type": "token_bucket", "capacity": 3, "per_second": 1}]}
    before = current_version()
    with committed():
        response = client.post(
            "/api/v1/tenants",
            {"key": "initech", "tier": "free", "overrides": overrides, "overrides_until": "2027-01-01T12:00:00"},
            format="json",
        )
    assert response.status_code == 201, response.content
    assert response.json() == {
        "key": "initech",
        "tier": "free",
        "overrides": overrides,
        "overrides_until": "2027-01-01T12:00:00Z",
        "version": 1,
    }
    assert response["Location"] == "/api/v1/tenants/initech"
    assert Tenant.objects.get(key="initech").rules.count() == 1
    assert current_version() == before + 1


def test_a_tenant_key_may_hold_a_slash(client):
    assert client.post("/api/v1/tenants", {"key": "org/team-1", "tier": "free"}, format="json").status_code == 201
    assert client.get("/api/v1/tenants/org/team-1").json()["key"] == "org/team-1"
    assert client.delete("/api/v1/tenants/org/team-1").status_code == 204


def test_a_tenant_of_an_unknown_tier_is_refused(client):
    error = error_of(client.post("/api/v1/tenants", {"key": "initech", "tier": "gold"}, format="json"), 400)
    assert list(error["fields"]) == ["tier"] and "gold" in error["fields"]["tier"]


def test_a_bad_override_is_named_by_its_path_and_saves_nothing(client):
    before = snapshot()
    body = {
        "key": "bigco",
        "tier": "free",
        "overrides_until": None,
        "version": 1,
        "overrides": {
            "user": [{"type": "token_bucket", "capacity": 3, "per_second": 1}],
            "team": [{"type": "token_bucket", "capacity": 600, "per_second": "fast"}],
        },
    }
    error = error_of(client.put("/api/v1/tenants/bigco", body, format="json"), 400)
    assert list(error["fields"]) == ["overrides.team.0.per_second"]
    assert snapshot() == before


def test_patching_a_tenants_tier_keeps_its_overrides(client):
    response = client.patch("/api/v1/tenants/bigco", {"tier": "free", "version": 1}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["tier"] == "free" and body["version"] == 2 and list(body["overrides"]) == ["team"]
    response = client.patch(
        "/api/v1/tenants/bigco", {"overrides": {"team": []}, "overrides_until": None, "version": 2}, format="json"
    )
    assert response.json()["overrides"] == {} and response.json()["overrides_until"] is None
    assert not Rule.objects.filter(tenant__key="bigco").exists()


def test_a_tenant_with_a_stale_version_is_a_409(client):
    client.patch("/api/v1/tenants/acme", {"tier": "free", "version": 1}, format="json")
    error = error_of(client.patch("/api/v1/tenants/acme", {"tier": "pro", "version": 1}, format="json"), 409)
    assert error["code"] == "conflict"
    assert Tenant.objects.get(key="acme").tier.name == "free"


def test_a_tenant_is_deleted_with_its_overrides(client):
    assert client.delete("/api/v1/tenants/bigco").status_code == 204
    assert not Tenant.objects.filter(key="bigco").exists()
    assert not Rule.objects.filter(tenant__isnull=False).exists()
    error_of(client.get("/api/v1/tenants/bigco"), 404)


def test_a_tenant_key_that_exists_already_is_a_409(client):
    error = error_of(client.post("/api/v1/tenants", {"key": "acme", "tier": "free"}, format="json"), 409)
    assert "key" in error["fields"]


# --- levels --------------------------------------------------------------------------------


def test_levels_are_listed_in_evaluation_order(client):
    body = client.get("/api/v1/levels").json()
    assert body["results"] == [
        {"name": "user", "position": 0, "fail_mode": "open", "fallback_fraction": 0.25, "version": 1},
        {"name": "team", "position": 1, "fail_mode": "open", "fallback_fraction": 0.25, "version": 1},
        {"name": "global", "position": 2, "fail_mode": "local", "fallback_fraction": 0.25, "version": 1},
    ]


def test_a_new_level_goes_last_unless_given_a_position(client, committed):
    before = current_version()
    with committed():
        response = client.post("/api/v1/levels", {"name": "org", "fail_mode": "closed"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json() == {
        "name": "org",
        "position": 3,
        "fail_mode": "closed",
        "fallback_fraction": 0.25,
        "version": 1,
    }
    assert current_version() == before + 1
    assert response["Location"] == "/api/v1/levels/org"


@pytest.mark.parametrize(
    "body, field",
    [
        ({"name": "org", "fail_mode": "sideways"}, "fail_mode"),
        ({"name": "org", "fail_mode": "local", "fallback_fraction": 0}, "fallback_fraction"),
        ({"name": "org", "fallback_fraction": 1.5}, "fallback_fraction"),
        ({"name": "no spaces"}, "name"),
        ({"name": "org", "position": -1}, "position"),
        ({"fail_mode": "open"}, "name"),
    ],
)
def test_a_bad_level_is_refused_naming_the_field(client, body, field):
    error = error_of(client.post("/api/v1/levels", body, format="json"), 400)
    assert list(error["fields"]) == [field]
    assert not Level.objects.filter(name="org").exists()


def test_a_level_is_changed_in_place_and_moves_its_version(client):
    response = client.patch("/api/v1/levels/global", {"fail_mode": "closed", "version": 1}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["version"] == 2
    assert Level.objects.get(name="global").fail_mode == "closed"
    body = {"name": "everyone", "position": 5, "fail_mode": "local", "fallback_fraction": 0.5}
    assert client.put("/api/v1/levels/global", {**body, "version": 2}, format="json").json() == {**body, "version": 3}
    assert client.get("/api/v1/priorities/batch").json()["levels"] == ["everyone"]


def test_a_level_put_must_send_every_field(client):
    error = error_of(client.put("/api/v1/levels/global", {"name": "global", "version": 1}, format="json"), 400)
    assert "required" in next(iter(error["fields"].values()))


def test_a_level_with_a_stale_version_is_a_409_and_changes_nothing(client):
    read = client.get("/api/v1/levels/global").json()
    assert (
        client.patch("/api/v1/levels/global", {"fallback_fraction": 0.5, "version": 1}, format="json").status_code
        == 200
    )  # someone else's change
    before = snapshot()
    error = error_of(client.put("/api/v1/levels/global", {**read, "fail_mode": "closed"}, format="json"), 409)
    assert error["code"] == "conflict"
    assert "version" in error["fields"] and "version 2, you sent 1" in error["message"]
    assert snapshot() == before


def test_a_level_write_that_loses_the_race_after_the_check_is_a_409_not_a_500(client, monkeypatch):
    real = LevelSerializer.validate

    def someone_saves_right_after_the_check(serializer, attrs):
        checked = real(serializer, attrs)
        Level.objects.filter(name="global").update(version=7)  # another save lands here
        return checked

    monkeypatch.setattr(LevelSerializer, "validate", someone_saves_right_after_the_check)
    error = error_of(client.patch("/api/v1/levels/global", {"fail_mode": "closed", "version": 1}, format="json"), 409)
    assert "changed since" in error["message"]
    assert Level.objects.get(name="global").fail_mode == "local"


def test_a_level_that_has_rules_cannot_be_deleted(client):
    error = error_of(client.delete("/api/v1/levels/team"), 409)
    assert error["code"] == "conflict"
    assert "has 3 rule(s)" in error["message"] and "tier pro" in error["message"]
    assert "tenant bigco" in error["message"]
    assert Level.objects.filter(name="team").exists()


def test_a_level_that_a_priority_class_uses_cannot_be_deleted(client):
    Rule.objects.filter(level__name="global").delete()
    error = error_of(client.delete("/api/v1/levels/global"), 409)
    assert "batch" in error["message"]


def test_an_unused_level_is_deleted(client):
    client.post("/api/v1/levels", {"name": "org"}, format="json")
    assert client.delete("/api/v1/levels/org").status_code == 204
    assert not Level.objects.filter(name="org").exists()


def test_a_level_name_that_exists_already_is_a_409(client):
    error_of(client.post("/api/v1/levels", {"name": "user"}, format="json"), 409)
    error_of(client.patch("/api/v1/levels/user", {"name": "team", "version": 1}, format="json"), 409)


# --- priority classes ----------------------------------------------------------------------


def test_priority_classes_are_listed_by_name(client):
    assert client.get("/api/v1/priorities").json()["results"] == [
        {"name": "batch", "watermark": 0.2, "levels": ["global"], "version": 1},
        {"name": "interactive", "watermark": 0.0, "levels": [], "version": 1},
    ]


def test_a_priority_class_is_created_changed_and_deleted(client, committed):
    before = current_version()
    with committed():
        response = client.post(
            "/api/v1/priorities", {"name": "bulk", "watermark": 0.5, "levels": ["team", "user"]}, format="json"
        )
    assert response.status_code == 201, response.content
    assert response.json() == {"name": "bulk", "watermark": 0.5, "levels": ["user", "team"], "version": 1}
    assert current_version() == before + 1

    response = client.patch("/api/v1/priorities/bulk", {"levels": [], "version": 1}, format="json")
    assert response.json() == {"name": "bulk", "watermark": 0.5, "levels": [], "version": 2}
    response = client.put(
        "/api/v1/priorities/bulk", {"name": "bulk", "watermark": 0.1, "levels": ["global"], "version": 2}, format="json"
    )
    assert response.json()["watermark"] == 0.1 and response.json()["version"] == 3
    assert client.delete("/api/v1/priorities/bulk").status_code == 204
    assert not PriorityClass.objects.filter(name="bulk").exists()


@pytest.mark.parametrize(
    "body, field",
    [
        ({"name": "bulk", "watermark": 1}, "watermark"),
        ({"name": "bulk", "watermark": -0.1}, "watermark"),
        ({"name": "bulk", "levels": ["user", "planet"]}, "levels.1"),
        ({"name": "bulk", "levels": "user"}, "levels"),
    ],
)
def test_a_bad_priority_class_is_refused_naming_the_field(client, body, field):
    error = error_of(client.post("/api/v1/priorities", body, format="json"), 400)
    assert list(error["fields"]) == [field]
    assert not PriorityClass.objects.filter(name="bulk").exists()


def test_a_priority_class_with_a_stale_version_is_a_409_and_changes_nothing(client):
    read = client.get("/api/v1/priorities/batch").json()
    assert (
        client.patch("/api/v1/priorities/batch", {"levels": ["team"], "version": 1}, format="json").status_code == 200
    )  # someone else's change: its levels alone
    before = snapshot()
    error = error_of(client.put("/api/v1/priorities/batch", {**read, "watermark": 0.5}, format="json"), 409)
    assert error["code"] == "conflict"
    assert "version" in error["fields"] and "version 2, you sent 1" in error["message"]
    assert snapshot() == before


# --- settings ------------------------------------------------------------------------------


def test_the_default_tier_is_read_and_set(client, committed):
    assert client.get("/api/v1/settings").json() == {"default_tier": "free"}
    before = current_version()
    with committed():
        response = client.put("/api/v1/settings", {"default_tier": "pro"}, format="json")
    assert response.json() == {"default_tier": "pro"}
    assert PolicySettings.load().default_tier.name == "pro"
    assert current_version() == before + 1
    assert client.patch("/api/v1/settings", {"default_tier": None}, format="json").json() == {"default_tier": None}


def test_an_unknown_default_tier_is_refused(client):
    error = error_of(client.put("/api/v1/settings", {"default_tier": "gold"}, format="json"), 400)
    assert list(error["fields"]) == ["default_tier"]
    assert PolicySettings.load().default_tier.name == "free"


def test_reading_the_settings_of_an_empty_store_writes_nothing(memory_engine, admin_api_client):
    assert admin_api_client.get("/api/v1/settings").json() == {"default_tier": None}
    assert not PolicySettings.objects.exists()


# --- every change reaches the decisions ----------------------------------------------------


def test_an_edit_through_the_api_changes_the_next_decision(client, decide_client, clock, committed):
    keys = {"user": "u1", "team": "acme", "global": "*"}
    assert decide_client.post("/api/v1/decisions", {"keys": keys, "cost": 40}, format="json").json()["allowed"]
    rules = {**PRO_RULES, "team": [{"type": "token_bucket", "capacity": 30, "per_second": 1}]}
    with committed():
        assert (
            client.put("/api/v1/tiers/pro", {"name": "pro", "rules": rules, "version": 1}, format="json").status_code
            == 200
        )
    clock.advance(CHECK_EVERY)  # the next version check: within a second

    body = decide_client.post("/api/v1/decisions", {"keys": keys, "cost": 40}, format="json").json()
    assert body["allowed"] is False
    assert body["blocked_by"] == "team: token_bucket(30, 1/s)"
    assert body["reason"] == "COST_EXCEEDS_LIMIT"


def test_a_tenant_override_made_through_the_api_applies_at_once(client, loaded, clock, committed):
    with committed():
        client.patch(
            "/api/v1/tenants/acme",
            {"version": 1, "overrides": {"team": [{"type": "token_bucket", "capacity": 2, "per_second": 1}]}},
            format="json",
        )
    clock.advance(CHECK_EVERY)
    assert loaded.decide({"team": "acme"}, cost=2).allowed
    assert loaded.decide({"team": "acme"}, cost=1).blocked_by == "team: token_bucket(2, 1/s)"


WRITES = [
    ("post", "/api/v1/tiers", {"name": "gold", "rules": {"user": PRO_RULES["team"]}}),
    ("patch", "/api/v1/tiers/pro", {"rules": {"user": None}, "version": 1}),
    ("delete", "/api/v1/tenants/acme", None),
    ("patch", "/api/v1/tenants/acme", {"overrides_until": "2030-01-01T00:00:00Z", "version": 1}),
    ("patch", "/api/v1/levels/user", {"fail_mode": "closed", "version": 1}),
    ("patch", "/api/v1/priorities/batch", {"watermark": 0.3, "version": 1}),
    ("patch", "/api/v1/priorities/batch", {"levels": ["team"], "version": 1}),
    ("delete", "/api/v1/priorities/batch", None),
    ("patch", "/api/v1/settings", {"default_tier": "pro"}),
]


@pytest.mark.parametrize("method, url, body", WRITES)
def test_every_write_bumps_the_policy_version_once(client, committed, method, url, body):
    before = current_version()
    with committed():
        response = getattr(client, method)(url, body, format="json")
    assert response.status_code in (200, 201, 204), response.content
    assert current_version() == before + 1


def test_a_refused_write_does_not_bump_the_policy_version(client, committed):
    before = current_version()
    with committed():
        error_of(
            client.patch("/api/v1/tiers/pro", {"rules": {"user": [{"type": "x"}]}, "version": 1}, format="json"), 400
        )
    assert current_version() == before


# --- who may call --------------------------------------------------------------------------

READS = [
    "/api/v1/tiers",
    "/api/v1/tiers/pro",
    "/api/v1/tenants",
    "/api/v1/tenants/acme",
    "/api/v1/levels",
    "/api/v1/levels/user",
    "/api/v1/priorities",
    "/api/v1/priorities/batch",
    "/api/v1/settings",
]
CHANGES = [
    ("post", "/api/v1/levels", {"name": "org"}),
    ("patch", "/api/v1/tiers/pro", {"version": 1}),
    ("put", "/api/v1/settings", {"default_tier": "pro"}),
    ("delete", "/api/v1/priorities/interactive", None),
]


@pytest.mark.parametrize("url", READS)
def test_reads_need_an_admin_token_or_an_operators_session(loaded, url, django_user_model):
    from rest_framework.test import APIClient

    assert error_of(APIClient().get(url), 401)["code"] == "not_authenticated"
    assert error_of(token_client(make_token("decide")).get(url), 403)["code"] == "permission_denied"
    assert token_client(make_token("admin")).get(url).status_code == 200
    staff = APIClient(enforce_csrf_checks=True)
    staff.force_login(django_user_model.objects.create_user("op", password="x", is_staff=True))
    assert staff.get(url).status_code == 200
    nobody = APIClient()
    nobody.force_login(django_user_model.objects.create_user("user", password="x"))
    assert error_of(nobody.get(url), 403)["code"] == "permission_denied"


def test_a_bad_or_revoked_token_is_a_401(loaded):
    from policies.models import ServiceToken

    assert token_client("la_0123456789ab_nonsense").get("/api/v1/tiers").status_code == 401
    token = make_token("admin")
    assert token_client(token).get("/api/v1/tiers").status_code == 200
    row = ServiceToken.objects.get()
    row.revoked_at = timezone.now()
    row.save()
    assert error_of(token_client(token).get("/api/v1/tiers"), 401)["code"] == "authentication_failed"


@pytest.mark.parametrize("method, url, body", CHANGES)
def test_changes_are_refused_to_anyone_but_an_operator_and_change_nothing(loaded, method, url, body, django_user_model):
    from rest_framework.test import APIClient

    before = snapshot()
    nobody = APIClient()
    nobody.force_login(django_user_model.objects.create_user("user", password="x"))
    for caller, status in [(APIClient(), 401), (token_client(make_token("decide")), 403), (nobody, 403)]:
        error_of(getattr(caller, method)(url, body, format="json"), status)
    assert snapshot() == before


@pytest.mark.parametrize("method, url, body", CHANGES)
def test_an_admin_token_may_change_without_csrf(loaded, method, url, body):
    response = getattr(token_client(make_token("admin")), method)(url, body, format="json")
    assert response.status_code in (200, 201, 204), response.content


@pytest.mark.parametrize("method, url, body", CHANGES)
def test_an_operators_session_needs_the_csrf_token_to_change(loaded, staff_client, method, url, body):
    before = snapshot()
    error = error_of(getattr(staff_client, method)(url, body, format="json"), 403)
    assert "CSRF" in error["message"]
    assert snapshot() == before

    secret = secrets.token_hex(16)
    staff_client.cookies["csrftoken"] = secret
    response = getattr(staff_client, method)(url, body, format="json", HTTP_X_CSRFTOKEN=secret)
    assert response.status_code in (200, 201, 204), response.content


# --- the history ---------------------------------------------------------------------------


def test_a_tokens_change_is_in_the_history_under_the_tokens_name(client):
    rules = {"user": [{"type": "token_bucket", "capacity": 5, "per_second": 1}]}
    assert client.post("/api/v1/tiers", {"name": "gold", "rules": rules}, format="json").status_code == 201
    assert (
        client.patch("/api/v1/priorities/batch", {"levels": ["team"], "version": 1}, format="json").status_code == 200
    )

    gold = Tier.objects.get(name="gold")
    created = gold.history.get()
    assert (created.history_type, created.history_user, created.history_change_reason) == (
        "+",
        None,
        "token:ops-script",
    )
    assert [r.history_change_reason for r in Rule.history.filter(tier_id=gold.pk)] == ["token:ops-script"]
    latest = PriorityClass.objects.get(name="batch").history.first()  # its new levels (an m2m change)
    assert [row.level.name for row in latest.levels.all()] == ["team"]
    assert (latest.history_user, latest.history_change_reason) == (None, "token:ops-script")


def test_an_operators_change_is_in_the_history_under_the_operator(loaded, staff_client):
    secret = secrets.token_hex(16)
    staff_client.cookies["csrftoken"] = secret
    rules = {"user": [{"type": "token_bucket", "capacity": 5, "per_second": 1}]}
    response = staff_client.post(
        "/api/v1/tiers", {"name": "gold", "rules": rules}, format="json", HTTP_X_CSRFTOKEN=secret
    )
    assert response.status_code == 201, response.content

    created = Tier.objects.get(name="gold").history.get()
    assert created.history_user.username == "operator"
    assert created.history_change_reason is None


# --- the schema ---------------------------------------------------------------------------


def test_the_schema_documents_the_policy_endpoints_with_rule_types_from_the_registry(loaded):
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.validation import validate_schema

    schema = SchemaGenerator().get_schema(request=None, public=True)
    validate_schema(schema)
    paths = [
        "/api/v1/tiers",
        "/api/v1/tiers/{name}",
        "/api/v1/tenants",
        "/api/v1/tenants/{key}",
        "/api/v1/levels",
        "/api/v1/levels/{name}",
        "/api/v1/priorities",
        "/api/v1/priorities/{name}",
        "/api/v1/settings",
    ]
    for path in paths:
        assert path in schema["paths"], path
        for operation in schema["paths"][path].values():
            assert operation["tags"] == ["policy"], path
    assert {"get", "put", "patch", "delete"} <= set(schema["paths"]["/api/v1/tiers/{name}"])
    assert "409" in schema["paths"]["/api/v1/tiers/{name}"]["put"]["responses"]
    components = schema["components"]["schemas"]
    mapping = components["RuleSpec"]["discriminator"]["mapping"]
    assert {"token_bucket", "sliding_window", "gcra", "concurrency"} <= set(mapping)
    token_bucket = components[mapping["token_bucket"].rsplit("/", 1)[1]]
    assert token_bucket["required"] == ["type", "capacity", "per_second"]
    assert token_bucket["properties"]["capacity"]["exclusiveMinimum"] is True
    assert "results" in schema["components"]["schemas"]["PaginatedTierList"]["properties"]
