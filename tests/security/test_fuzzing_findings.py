"""What making the schema tell the truth found in the server, and what was fixed, each pinned
by a plain test: numbers are ASCII digits, strings are taken as sent, a name is matched whole,
a rule's label may be null but not blank, and a repeated rule is a 409 like a taken name."""

import pytest
from rest_framework.test import APIClient

from policies.models import Level, Tenant

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
