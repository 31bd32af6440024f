"""What schemathesis found in the API and what was fixed, each pinned by a plain test: lists
take only whole numbers for `limit` and `offset`, the default tier is a name or null (never
""), and the schema documents every answer a settlement can give."""

import pytest
from rest_framework.test import APIClient

from .conftest import make_token


@pytest.fixture
def admin(loaded):
    return APIClient(HTTP_AUTHORIZATION=f"Bearer {make_token('admin', 'ops')}")


@pytest.mark.parametrize(
    "query", ["limit=abc", "limit=0", "limit=-1", "offset=null", "offset=-2", "limit=1.5", "limit=%EF%BC%91"]
)  # a full-width digit one
def test_a_list_refuses_a_limit_or_offset_that_is_not_a_whole_number(admin, query):
    response = admin.get(f"/api/v1/tiers?{query}")
    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["fields"]) == [query.split("=")[0]]


def test_a_list_pages_with_whole_numbers_and_caps_the_limit_at_1000(admin):
    assert [tier["name"] for tier in admin.get("/api/v1/tiers?limit=1&offset=1").json()["results"]] == ["pro"]
    assert admin.get("/api/v1/tiers?limit=5000").json()["count"] == 2


def test_the_default_tier_is_a_name_or_null_never_an_empty_string(admin):
    response = admin.patch("/api/v1/settings", {"default_tier": ""}, format="json")
    assert response.status_code == 400
    assert admin.get("/api/v1/settings").json() == {"default_tier": "free"}
    assert admin.patch("/api/v1/settings", {"default_tier": None}, format="json").json() == {"default_tier": None}


def test_the_schema_documents_every_answer_of_a_settlement_and_the_bounds_of_lists(admin):
    schema = APIClient().get("/api/schema/", HTTP_ACCEPT="application/json").json()
    for action in ("commit", "cancel"):
        answers = schema["paths"][f"/api/v1/reservations/{{reservation_id}}/{action}"]["post"]["responses"]
        assert {"200", "400", "401", "403", "404", "409", "503"} <= set(answers)
    parameters = {p["name"]: p["schema"] for p in schema["paths"]["/api/v1/tiers"]["get"]["parameters"]}
    assert parameters["limit"]["minimum"] == 1 and parameters["offset"]["minimum"] == 0
    top = next(p for p in schema["paths"]["/api/v1/stats/blocked"]["get"]["parameters"] if p["name"] == "top")
    assert (top["schema"]["minimum"], top["schema"]["maximum"]) == (1, 100)
