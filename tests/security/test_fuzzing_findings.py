"""What making the schema tell the truth found in the server, and what was fixed, each pinned
by a plain test: numbers are ASCII digits, strings are taken as sent, a name is matched whole,
a rule's label may be null but not blank, and a repeated rule is a 409 like a taken name.

Then issue 26's bad input: a body nested hundreds of levels deep (a 500 from a RecursionError)
is refused while it is parsed, and a name is a JSON string, never a number read as one. The
third, a chunked body read as empty, needs a real gunicorn: test_chunked_bodies.py."""

import pytest
from rest_framework.test import APIClient

from policies.models import Level, PolicySettings, PriorityClass, Rule, Tenant, Tier

from .conftest import make_token

TOKEN_BUCKET = {"type": "token_bucket", "capacity": 5, "per_second": 1}


@pytest.fixture
def admin(loaded):
    return APIClient(HTTP_AUTHORIZATION=f"Bearer {make_token('admin', 'ops')}")


@pytest.mark.parametrize("top", ["²", "٣", "1²"])  # str.isdigit() says yes; int() fails or reads Arabic-Indic
def test_top_takes_ascii_digits_only_never_a_500(admin, top):
    response = admin.get("/api/v1/stats/blocked", {"top": top})
    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["fields"]) == ["top"]


@pytest.mark.parametrize("window", [" 5m", "5m ", "5 m", "05m", "٥m", "0s", "1441m", "25h", "2d", ""])
def test_a_window_is_1s_to_24h_written_plainly(admin, window):
    response = admin.get("/api/v1/stats/blocked", {"window": window})
    assert response.status_code == 400, response.content


def test_a_tenant_key_is_taken_as_sent_not_trimmed(admin):
    response = admin.post("/api/v1/tenants", {"key": " acme-eu ", "tier": "pro"}, format="json")
    assert response.status_code == 201, response.content
    assert Tenant.objects.filter(key=" acme-eu ").exists()  # the gateway sends it so, and is matched so


@pytest.mark.parametrize("name", ["eu\n", " eu", "eu west", ""])
def test_a_level_name_is_matched_whole(admin, name):
    response = admin.post("/api/v1/levels", {"name": name}, format="json")
    assert response.status_code == 400, response.content
    assert not Level.objects.filter(name=name).exists()


def test_a_rule_label_may_be_null_but_not_blank(admin):
    rules = {"user": [{**TOKEN_BUCKET, "label": None}]}
    assert admin.post("/api/v1/tiers", {"name": "gold", "rules": rules}, format="json").status_code == 201
    rules = {"user": [{**TOKEN_BUCKET, "label": " \x1c"}]}
    response = admin.post("/api/v1/tiers", {"name": "silver", "rules": rules}, format="json")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["rules.user.0.label"]


def test_a_rule_spelling_out_a_default_repeats_the_one_that_leaves_it_out(admin):
    rules = {"user": [TOKEN_BUCKET, {**TOKEN_BUCKET, "counts": "cost", "label": "AGAIN"}]}
    response = admin.post("/api/v1/tiers", {"name": "gold", "rules": rules}, format="json")
    assert response.status_code == 409, response.content
    assert list(response.json()["error"]["fields"]) == ["rules.user.1"]


def policy_rows() -> list:
    """Every row a policy write could leave behind, with its version."""
    return [
        *Tier.objects.values_list("name", "version"),
        *Tenant.objects.values_list("key", "tier__name", "version"),
        *Level.objects.values_list("name", "version"),
        *PriorityClass.objects.values_list("name", "version"),
        *PolicySettings.objects.values_list("default_tier__name"),
        Rule.objects.count(),
    ]


# Issue 26: nesting ----------------------------------------------------------------------------

TOO_DEEP = "JSON parse error - nested more than 64 levels deep"


def nested(depth: int) -> str:
    """An array `depth` levels deep, as JSON text (json.dumps would recurse as deep)."""
    return "[" * depth + "]" * depth


# Every path that reads a JSON body, each body with `%s` one level below its own object.
BODIES = [
    pytest.param("post", "/api/v1/tenants", '{"key": "acme-eu", "tier": %s}', id="tenant"),
    pytest.param("patch", "/api/v1/settings", '{"default_tier": %s}', id="settings"),
    pytest.param("post", "/api/v1/tiers", '{"name": "gold", "rules": {"user": [{"capacity": %s}]}}', id="tier"),
    pytest.param("post", "/api/v1/levels", '{"name": %s}', id="level"),
    pytest.param("post", "/api/v1/priorities", '{"name": "bulk", "levels": %s}', id="priority"),
    pytest.param("post", "/api/v1/whatif", '{"policy": {"tenants": {"acme": {"tier": %s}}}}', id="what-if"),
    pytest.param("post", "/api/v1/decisions", '{"keys": {"user": %s}}', id="decision"),
    pytest.param("post", "/api/v1/decisions/batch", '{"requests": [{"keys": {"user": %s}}]}', id="batch"),
    pytest.param("post", "/api/v1/reservations", '{"keys": {"user": %s}}', id="reservation"),
    pytest.param("post", "/api/v1/rls/json", '{"domain": %s}', id="rls"),
]


def levels_around(body: str) -> int:
    """How deep `%s` sits in `body`: the arrays and objects around it."""
    before = body.split("%s")[0]
    return before.count("{") + before.count("[") - before.count("}") - before.count("]")


@pytest.mark.parametrize(("method", "path", "body"), BODIES)
@pytest.mark.parametrize("depth", [468, 100_000], ids=["468 deep, was a 500", "past Python's stack"])
def test_a_body_nested_hundreds_of_levels_deep_is_refused_while_parsing_never_a_500(admin, method, path, body, depth):
    before = policy_rows()
    response = getattr(admin, method)(path, body % nested(depth), content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json() == {"error": {"code": "malformed_request", "message": TOO_DEEP, "fields": {}}}
    assert policy_rows() == before


@pytest.mark.parametrize(("method", "path", "body"), BODIES)
def test_a_body_nested_64_levels_deep_is_read_and_the_field_named(admin, method, path, body):
    before = policy_rows()
    deepest = body % nested(64 - levels_around(body))
    response = getattr(admin, method)(path, deepest, content_type="application/json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid" and error["fields"], error
    assert policy_rows() == before


@pytest.mark.parametrize(("method", "path", "body"), BODIES)
def test_one_level_more_is_refused(admin, method, path, body):
    deeper = body % nested(65 - levels_around(body))
    response = getattr(admin, method)(path, deeper, content_type="application/json")
    assert response.json()["error"] == {"code": "malformed_request", "message": TOO_DEEP, "fields": {}}


def test_a_long_batch_is_not_too_deep_for_all_its_brackets(admin):
    batch = {"requests": [{"keys": {"user": f"u{i}", "team": "acme"}} for i in range(1000)]}
    assert admin.post("/api/v1/decisions/batch", batch, format="json").status_code == 200


# Issue 26: a number read as a name --------------------------------------------------------------


@pytest.fixture
def tiers_named_like_numbers(admin):
    """Tiers that `1` and `true` would be read as, were they read as strings."""
    for name in ("1", "True"):
        rules = {"user": [TOKEN_BUCKET]}
        assert admin.post("/api/v1/tiers", {"name": name, "rules": rules}, format="json").status_code == 201


@pytest.mark.parametrize(
    ("tier", "kind"),
    [(1, "a number"), (True, "a boolean"), (1.0, "a number"), (["pro"], "an array"), ({"name": "pro"}, "an object")],
)
def test_a_tenant_names_its_tier_with_a_string_never_a_number(admin, tiers_named_like_numbers, tier, kind):
    response = admin.post("/api/v1/tenants", {"key": "acme-eu", "tier": tier}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["fields"] == {"tier": f"must be a string, not {kind}"}
    assert not Tenant.objects.filter(key="acme-eu").exists()


@pytest.mark.parametrize(("tier", "kind"), [(1, "a number"), (True, "a boolean")])
def test_the_default_tier_is_named_with_a_string_never_a_number(admin, tiers_named_like_numbers, tier, kind):
    response = admin.patch("/api/v1/settings", {"default_tier": tier}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["fields"] == {"default_tier": f"must be a string, not {kind}"}
    assert PolicySettings.objects.get().default_tier.name == "free"


def gold(**rule) -> dict:
    """A new tier whose one rule is the token bucket with `rule`'s changes."""
    return {"name": "gold", "rules": {"user": [{**TOKEN_BUCKET, **rule}]}}


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        pytest.param("post", "/api/v1/tiers", {**gold(), "name": 1}, "name", id="tier name"),
        pytest.param("post", "/api/v1/tenants", {"key": 1, "tier": "pro"}, "key", id="tenant key"),
        pytest.param("post", "/api/v1/tenants", {"key": "acme-eu", "tier": 1}, "tier", id="tenant's tier"),
        pytest.param("patch", "/api/v1/tenants/acme", {"tier": 1, "version": 1}, "tier", id="tenant's new tier"),
        pytest.param("post", "/api/v1/levels", {"name": 1}, "name", id="level name"),
        pytest.param("post", "/api/v1/priorities", {"name": 1}, "name", id="priority name"),
        pytest.param("post", "/api/v1/priorities", {"name": "bulk", "levels": ["user", 1]}, "levels.1", id="levels"),
        pytest.param("patch", "/api/v1/settings", {"default_tier": 1}, "default_tier", id="default tier"),
        pytest.param("post", "/api/v1/tiers", gold(label=1), "rules.user.0.label", id="rule label"),
        pytest.param("post", "/api/v1/tiers", gold(type=1), "rules.user.0.type", id="rule type"),
        pytest.param("post", "/api/v1/tiers", gold(counts=1), "rules.user.0.counts", id="rule counts"),
    ],
)
def test_every_name_and_key_a_policy_write_takes_refuses_a_number_and_saves_nothing(
    admin, tiers_named_like_numbers, method, path, body, field
):
    before = policy_rows()
    response = getattr(admin, method)(path, body, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["fields"]) == [field]
    assert policy_rows() == before


@pytest.mark.parametrize("position", [2**31, 58_093_253_399_112])
def test_a_level_position_past_what_every_database_holds_is_a_400_not_a_503(admin, position):
    """schemathesis on PostgreSQL: 58093253399112 passed the serializer (SQLite's bound, read
    when the class was made) and overflowed PostgreSQL's integer column, a 503."""
    response = admin.post("/api/v1/levels", {"name": "deep", "position": position}, format="json")
    assert response.status_code == 400 and "position" in response.json()["error"]["fields"]
    assert not Level.objects.filter(name="deep").exists()
    assert admin.post("/api/v1/levels", {"name": "deep", "position": 2**31 - 1}, format="json").status_code == 201
