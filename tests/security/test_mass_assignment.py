"""Mass assignment: a write that names a field the server owns (ids, versions, timestamps, a
token's digest, prefix or scope) is refused, or that field is left as it was. Nothing is
half-saved: a refused write changes no row."""

import io

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from policies.models import ServiceToken

from .conftest import make_token

BUCKET = {"type": "token_bucket", "capacity": 5, "per_second": 1}
# Each resource: its collection (None: it cannot be created), one item, and a valid new row.
RESOURCES = {
    "tier": ("/api/v1/tiers", "/api/v1/tiers/pro", {"name": "gold", "rules": {"user": [BUCKET]}}),
    "tenant": ("/api/v1/tenants", "/api/v1/tenants/acme", {"key": "newco", "tier": "free"}),
    "level": ("/api/v1/levels", "/api/v1/levels/user", {"name": "region"}),
    "priority class": ("/api/v1/priorities", "/api/v1/priorities/batch", {"name": "bulk", "watermark": 0.5}),
    "settings": (None, "/api/v1/settings", None),
}
# Fields the server owns, by their model's names and by names a client might guess.
SERVER_FIELDS = [
    "id",
    "pk",
    "created_at",
    "updated_at",
    "history",
    "history_id",
    "policy_version",
    "tier_id",
    "level_id",
    "default_tier_id",
    "rules_id",
    "position_id",
    "owner",
]


@pytest.fixture
def admin_client(loaded):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token('admin', 'ops-script')}")
    return client


def database() -> str:
    """Every row of every table the API writes, to show that a refused write changed none."""
    out = io.StringIO()
    call_command("dumpdata", "policies", "auth", stdout=out)
    return out.getvalue()


def refused(response, field: str) -> None:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert list(error["fields"]) == [field], error
    assert "unknown field" in error["fields"][field] or "read-only" in error["fields"][field]


@pytest.mark.parametrize("field", SERVER_FIELDS)
@pytest.mark.parametrize("resource", [name for name, (collection, _, _) in RESOURCES.items() if collection])
def test_a_create_naming_a_field_the_server_owns_is_refused(admin_client, resource, field):
    collection, _, new = RESOURCES[resource]
    before = database()
    refused(admin_client.post(collection, {**new, field: 7}, format="json"), field)
    assert database() == before


@pytest.mark.parametrize("method", ["put", "patch"])
@pytest.mark.parametrize("field", SERVER_FIELDS)
@pytest.mark.parametrize("resource", list(RESOURCES))
def test_a_change_naming_a_field_the_server_owns_is_refused(admin_client, resource, field, method):
    _, item, _ = RESOURCES[resource]
    body = admin_client.get(item).json()  # everything it has, as read: a valid PUT
    before = database()
    refused(getattr(admin_client, method)(item, {**body, field: 7}, format="json"), field)
    assert database() == before


@pytest.mark.parametrize("resource", [name for name in RESOURCES if name != "settings"])
def test_a_version_sent_when_creating_is_refused_for_every_versioned_resource(admin_client, resource):
    collection, _, new = RESOURCES[resource]
    before = database()
    refused(admin_client.post(collection, {**new, "version": 42}, format="json"), "version")
    assert database() == before


@pytest.mark.parametrize("resource", [name for name in RESOURCES if name != "settings"])
def test_a_version_cannot_be_moved_by_sending_another_one(admin_client, resource):
    _, item, _ = RESOURCES[resource]
    body = admin_client.get(item).json()
    before = database()
    response = admin_client.patch(item, {"version": body["version"] + 10}, format="json")
    assert response.status_code == 409
    assert database() == before
    assert admin_client.get(item).json()["version"] == body["version"]


def test_there_is_no_api_to_read_or_make_tokens(admin_client):
    for path in ("/api/v1/tokens", "/api/v1/servicetokens", "/api/v1/service-tokens"):
        assert admin_client.get(path).status_code == 404
        assert admin_client.post(path, {"name": "x", "scope": "admin"}, format="json").status_code == 404


def test_the_token_admin_keeps_digest_prefix_scope_and_creation_time_whatever_is_posted(loaded, operator, client):
    token = make_token("decide", "edge-gateway")
    row = ServiceToken.objects.get(prefix=token.split("_")[1])
    kept = (row.digest, row.prefix, row.scope, row.created_at)
    client.force_login(operator)
    response = client.post(
        f"/admin/policies/servicetoken/{row.pk}/change/",
        {
            "name": "renamed",
            "scope": "admin",
            "prefix": "0" * 12,
            "digest": "0" * 64,
            "created_at_0": "2020-01-01",
            "created_at_1": "00:00:00",
            "revoked_at_0": "",
            "revoked_at_1": "",
        },
    )
    assert response.status_code == 302, response.content[:500]
    row.refresh_from_db()
    assert row.name == "renamed"
    assert (row.digest, row.prefix, row.scope, row.created_at) == kept
    assert client.get(f"/admin/policies/servicetoken/{row.pk}/change/").content.decode().count(row.digest) == 0


def test_a_revoked_token_cannot_be_brought_back_through_the_admin(loaded, operator, client):
    token = make_token("admin", "retired")
    row = ServiceToken.objects.get(prefix=token.split("_")[1])
    row.revoked_at = timezone.now()
    row.save(update_fields=["revoked_at"])
    client.force_login(operator)
    client.post(
        f"/admin/policies/servicetoken/{row.pk}/change/", {"name": "retired", "revoked_at_0": "", "revoked_at_1": ""}
    )
    row.refresh_from_db()
    assert row.revoked_at is not None
    assert APIClient(HTTP_AUTHORIZATION=f"Bearer {token}").get("/api/v1/tiers").status_code == 401
