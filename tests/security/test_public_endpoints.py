"""What anyone may read without credentials: the probes, /metrics, the OpenAPI schema and its
docs page. None of them tells a secret, a token, or who is being limited."""

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from .conftest import make_token

PUBLIC = ["/healthz", "/readyz", "/metrics", "/api/schema/", "/api/docs/"]
USER_KEY, TEAM_KEY = "user-5c1e9a", "team-9d2b07"  # a team of the default tier, free


@pytest.fixture
def busy(loaded):
    """Decisions made, some denied, with tokens of both scopes: what /metrics counts."""
    tokens = [make_token("decide", "edge"), make_token("admin", "ops")]
    gateway = APIClient(HTTP_AUTHORIZATION=f"Bearer {tokens[0]}")
    for _ in range(12):  # the free tier's user bucket holds 10
        gateway.post("/api/v1/decisions", {"keys": {"user": USER_KEY, "team": TEAM_KEY, "global": "*"}}, format="json")
    return tokens


@pytest.mark.parametrize("path", PUBLIC)
def test_a_public_page_answers_anyone(busy, path):
    assert APIClient().get(path).status_code == 200


@pytest.mark.parametrize("path", PUBLIC)
def test_a_public_page_tells_no_token_no_secret_key_and_no_key_being_limited(busy, path):
    text = APIClient().get(path).content.decode()
    for token in busy:
        assert token not in text and token.split("_", 2)[2] not in text
    assert settings.SECRET_KEY not in text
    assert USER_KEY not in text


def test_metrics_count_by_result_level_and_reason_never_by_key(busy):
    text = APIClient().get("/metrics").content.decode()
    # The count adds up over the whole test process: only the series is checked.
    assert 'limiter_decisions_total{level="user",reason="RATE_LIMITED",result="denied"} ' in text
    assert TEAM_KEY not in text


def test_the_schema_describes_the_bearer_scheme_and_holds_no_example_token(busy):
    schema = APIClient().get("/api/schema/", HTTP_ACCEPT="application/json").json()
    assert schema["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    assert "la_" not in str(schema.get("components", {}).get("examples", ""))


def test_a_bad_token_is_refused_even_where_no_token_is_needed(db):
    """A bad credential is an error wherever the API reads it: never quietly anonymous."""
    response = APIClient(HTTP_AUTHORIZATION="Bearer la_000000000000_no-such-token").get("/api/schema/")
    assert response.status_code == 401
