"""The OpenAPI schema at /api/schema/ tells the truth about requests: it lists the levels,
tiers and priority classes configured now (to callers that may use them), refuses unknown
fields, and offers `version` only where the server reads it."""

import re

import pytest
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

from policies.durations import MAX_WINDOW, WINDOW_PATTERN
from policies.models import Level, PriorityClass, Tier
from policies.services.errors import Invalid
from policies.services.usage import parse_window

from .conftest import make_token, token_client

LEVELS = ["user", "team", "global"]  # SPEC.md's example policy, in evaluation order


@pytest.fixture
def loaded(memory_engine, load, policy_doc):
    load(policy_doc)
    return memory_engine


def served(client) -> dict:
    response = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200, response.content
    return response.json()


@pytest.fixture
def admin_schema(loaded):
    return served(token_client(make_token("admin", "ops")))


def component(schema, name):
    return schema["components"]["schemas"][name]


def parameter(schema, path, name):
    return next(p["schema"] for p in schema["paths"][path]["get"]["parameters"] if p["name"] == name)


# --- the configured names ---------------------------------------------------------------------


def test_it_names_the_configured_levels_where_a_request_is_keyed_by_level(admin_schema):
    keys = component(admin_schema, "DecisionRequestRequest")["properties"]["keys"]
    assert list(keys["properties"]) == LEVELS
    assert keys["additionalProperties"] is False and keys["minProperties"] == 1
    assert list(component(admin_schema, "ReservationRequestRequest")["properties"]["keys"]["properties"]) == LEVELS
    for name, field in (
        ("NewTierRequest", "rules"),
        ("PatchedTierRequest", "rules"),
        ("NewTenantRequest", "overrides"),
        ("TenantRequest", "overrides"),
    ):
        rules = component(admin_schema, name)["properties"][field]
        assert list(rules["properties"]) == LEVELS and rules["additionalProperties"] is False, name
    assert component(admin_schema, "PriorityRequest")["properties"]["levels"]["items"]["enum"] == LEVELS
    assert parameter(admin_schema, "/api/v1/buckets", "level")["enum"] == LEVELS


def test_it_names_the_configured_priority_classes_and_tiers(admin_schema):
    priority = component(admin_schema, "DecisionRequestRequest")["properties"]["priority"]
    assert priority["enum"] == ["batch", "interactive", None] and priority["nullable"] is True
    assert component(admin_schema, "NewTenantRequest")["properties"]["tier"]["enum"] == ["free", "pro"]
    assert component(admin_schema, "SettingsRequest")["properties"]["default_tier"]["enum"] == ["free", "pro", None]


def test_a_tier_needs_a_rule_at_some_level_when_created_or_replaced_not_when_changed(admin_schema):
    for name in ("NewTierRequest", "TierRequest"):
        some = component(admin_schema, name)["properties"]["rules"]["anyOf"]
        assert [branch["required"] for branch in some] == [[level] for level in LEVELS]
    assert "anyOf" not in component(admin_schema, "PatchedTierRequest")["properties"]["rules"]
    assert "anyOf" not in component(admin_schema, "NewTenantRequest")["properties"]["overrides"]


def test_the_schema_changes_as_soon_as_the_policy_does(loaded, admin_api_client):
    Level.objects.create(name="region", position=5)
    Tier.objects.create(name="gold")
    PriorityClass.objects.filter(name="batch").delete()
    schema = served(admin_api_client)
    request = component(schema, "DecisionRequestRequest")["properties"]
    assert list(request["keys"]["properties"]) == [*LEVELS, "region"]
    assert request["priority"]["enum"] == ["interactive", None]
    assert component(schema, "NewTenantRequest")["properties"]["tier"]["enum"] == ["free", "gold", "pro"]


def test_the_live_schema_is_valid_openapi_even_with_nothing_configured(db, admin_api_client):
    schema = served(admin_api_client)
    validate_schema(schema)
    keys = component(schema, "DecisionRequestRequest")["properties"]["keys"]
    assert keys["properties"] == {} and keys["additionalProperties"] is False  # no request can be decided
    assert component(schema, "NewTenantRequest")["properties"]["tier"]["not"] == {}  # no tier to name
    assert component(schema, "SettingsRequest")["properties"]["default_tier"]["enum"] == [None]
    assert component(schema, "NewTierRequest")["properties"]["rules"]["not"] == {}


def test_the_live_schema_is_valid_openapi(admin_schema):
    validate_schema(admin_schema)


# --- who is told the names ---------------------------------------------------------------------


def test_a_decide_token_is_told_the_levels_and_priority_classes_but_not_the_tiers(loaded, decide_client):
    schema = served(decide_client)
    request = component(schema, "DecisionRequestRequest")["properties"]
    assert list(request["keys"]["properties"]) == LEVELS
    assert request["priority"]["enum"] == ["batch", "interactive", None]
    tier = component(schema, "NewTenantRequest")["properties"]["tier"]
    assert "enum" not in tier and tier["type"] == "string"


def test_anyone_else_gets_the_static_shape_with_no_name_configured(loaded):
    schema = served(APIClient())
    keys = component(schema, "DecisionRequestRequest")["properties"]["keys"]
    assert "properties" not in keys and keys["additionalProperties"]["type"] == "string"
    assert "enum" not in component(schema, "DecisionRequestRequest")["properties"]["priority"]
    assert "enum" not in parameter(schema, "/api/v1/buckets", "level")
    assert "interactive" not in str(schema) and "x-policy-names" not in str(schema)
    validate_schema(schema)


# --- requests as the server reads them ---------------------------------------------------------


@pytest.mark.parametrize("resource", ["Tier", "Tenant", "Level", "Priority"])
def test_version_is_left_out_on_create_required_on_put_and_patch(admin_schema, resource):
    create = component(admin_schema, f"New{resource}Request")
    assert "version" not in create["properties"]
    replace = component(admin_schema, f"{resource}Request")
    assert set(replace["required"]) == set(replace["properties"])  # PUT sends every field
    assert "version" in replace["required"]
    assert component(admin_schema, f"Patched{resource}Request")["required"] == ["version"]
    plural = {"Tier": "tiers", "Tenant": "tenants", "Level": "levels", "Priority": "priorities"}[resource]
    body = admin_schema["paths"][f"/api/v1/{plural}"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["$ref"].endswith(f"/New{resource}Request")


def test_every_object_in_a_request_body_refuses_unknown_fields(admin_schema):
    def objects(node):
        if isinstance(node, dict):
            if "properties" in node:
                yield node
            for key, value in node.items():
                if key != "anyOf":  # "some level has a rule": a condition, not an object's shape
                    yield from objects(value)
        elif isinstance(node, list):
            for value in node:
                yield from objects(value)

    requests = [schema for name, schema in admin_schema["components"]["schemas"].items() if name.endswith("Request")]
    assert len(requests) > 10
    for found in (node for schema in requests for node in objects(schema)):
        assert found["additionalProperties"] is False, found


def test_a_batch_item_takes_no_dry_run_and_a_batch_holds_1_to_1000(admin_schema):
    batch = component(admin_schema, "BatchRequestRequest")["properties"]["requests"]
    assert (batch["minItems"], batch["maxItems"]) == (1, 1000)
    dry_run = component(admin_schema, "BatchItemRequest")["properties"]["dry_run"]
    assert component(admin_schema, dry_run["allOf"][0]["$ref"].rsplit("/", 1)[1])["enum"] == [False]


def test_the_window_pattern_is_exactly_what_the_server_takes(admin_schema):
    pattern = parameter(admin_schema, "/api/v1/stats/blocked", "window")["pattern"]
    assert pattern == f"^(?:{WINDOW_PATTERN})$"
    taken = set()
    for unit, seconds in (("", 1), ("s", 1), ("m", 60), ("h", 3600), ("d", 86400)):
        for number in [*range(0, 1500), *range(86_390, 86_410)]:
            for text in (f"{number}{unit}", f"0{number}{unit}", f" {number}{unit}"):
                matches = re.search(pattern, text) is not None
                try:
                    assert parse_window(text) == number * seconds
                    taken.add(text)
                except Invalid:
                    pass
                assert matches == (text in taken), text
                assert matches == (text == f"{number}{unit}" and 0 < number * seconds <= MAX_WINDOW), text


def test_a_quota_is_documented_from_its_declared_parameters(admin_schema):
    quota = component(admin_schema, "QuotaRule")
    assert quota["required"] == ["type", "limit", "period"]

    def choices(field):  # drf-spectacular names each enum as a component of its own
        name = quota["properties"][field]["allOf"][0]["$ref"].rsplit("/", 1)[1]
        return component(admin_schema, name)["enum"]

    assert choices("period") == ["hour", "day", "week", "month", "none"]
    assert choices("mode") == ["hard", "soft"] and quota["properties"]["mode"]["default"] == "hard"
    assert quota["properties"]["timezone"]["default"] == "UTC"
    demote_to = quota["properties"]["demote_to"]
    assert (demote_to["type"], demote_to["nullable"], demote_to["default"]) == ("string", True, None)
