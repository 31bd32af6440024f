"""Reservations over REST: reserve an estimate, settle with the actual cost, exactly."""

import pytest

RESERVE = "/api/v1/reservations"
KEYS = {"user": "u1", "team": "lab"}


def policy():
    return {
        "default_tier": "t",
        "levels": [{"name": "user"}, {"name": "team"}],
        "tiers": {
            "t": {
                "user": [{"type": "token_bucket", "capacity": 100, "per_second": 0}],
                "team": [
                    {"type": "token_bucket", "capacity": 1000, "per_second": 0},
                    {"type": "concurrency", "limit": 2, "lease": 30},
                ],
            }
        },
    }


@pytest.fixture
def lab(engine, load):
    load(policy())
    return engine


def tokens(client, level, key):
    rules = client.get("/api/v1/buckets", {"level": level, "key": key, "team": "lab"}).json()["rules"]
    return rules[0]["state"]["tokens"]


def in_flight(client):
    rules = client.get("/api/v1/buckets", {"level": "team", "key": "lab"}).json()["rules"]
    return rules[1]["state"]["in_flight"]


def reserve(client, cost, **more):
    return client.post(RESERVE, {"keys": KEYS, "cost": cost, **more}, format="json")


def test_a_commit_refunds_what_the_estimate_overshot(lab, decide_client, admin_api_client):
    response = reserve(decide_client, 80)
    assert response.status_code == 201
    body = response.json()
    assert body["allowed"] is True and body["id"] and body["expires_at"].endswith("Z")
    assert tokens(admin_api_client, "user", "u1") == 20
    assert in_flight(admin_api_client) == 1
    settled = decide_client.post(f"{RESERVE}/{body['id']}/commit", {"actual_cost": 30}, format="json")
    assert settled.status_code == 200
    assert settled.json()["refunded"] == 50 and settled.json()["charged"] == 0
    assert tokens(admin_api_client, "user", "u1") == 70
    assert tokens(admin_api_client, "team", "lab") == 970
    assert in_flight(admin_api_client) == 0


def test_a_commit_charges_what_the_estimate_missed(lab, decide_client, admin_api_client):
    rid = reserve(decide_client, 10).json()["id"]
    settled = decide_client.post(f"{RESERVE}/{rid}/commit", {"actual_cost": 25}, format="json").json()
    assert settled["charged"] == 15
    assert tokens(admin_api_client, "user", "u1") == 75


def test_a_cancel_refunds_everything(lab, decide_client, admin_api_client):
    rid = reserve(decide_client, 60).json()["id"]
    response = decide_client.post(f"{RESERVE}/{rid}/cancel")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    assert tokens(admin_api_client, "user", "u1") == 100
    assert in_flight(admin_api_client) == 0


def test_settling_twice_is_a_409_and_refunds_once(lab, decide_client, admin_api_client):
    rid = reserve(decide_client, 60).json()["id"]
    assert decide_client.post(f"{RESERVE}/{rid}/commit", {"actual_cost": 10}, format="json").status_code == 200
    again = decide_client.post(f"{RESERVE}/{rid}/commit", {"actual_cost": 10}, format="json")
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
    assert decide_client.post(f"{RESERVE}/{rid}/cancel").status_code == 409
    assert tokens(admin_api_client, "user", "u1") == 90


def test_an_unknown_reservation_is_a_404(lab, decide_client):
    response = decide_client.post(f"{RESERVE}/no-such-id/commit", {"actual_cost": 1}, format="json")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_an_expired_reservation_is_a_404_and_its_slot_came_back(lab, decide_client, admin_api_client, clock):
    rid = reserve(decide_client, 5, hold=10).json()["id"]
    clock.advance(10.5)
    response = decide_client.post(f"{RESERVE}/{rid}/commit", {"actual_cost": 1}, format="json")
    assert response.status_code == 404
    assert in_flight(admin_api_client) == 0
    assert tokens(admin_api_client, "user", "u1") == 95  # an unsettled estimate stays spent


def test_the_concurrency_limit_denies_a_third_reservation(lab, decide_client):
    assert reserve(decide_client, 1).status_code == 201
    assert reserve(decide_client, 1).status_code == 201
    third = reserve(decide_client, 1)
    assert third.status_code == 200
    assert third.json()["allowed"] is False and third.json()["id"] is None
    assert third.json()["blocked_by"].startswith("team: concurrency(2, lease 30s)")


def test_a_denied_reservation_takes_nothing(lab, decide_client, admin_api_client):
    denied = reserve(decide_client, 150).json()
    assert denied["allowed"] is False and denied["reason"] == "COST_EXCEEDS_LIMIT"
    assert tokens(admin_api_client, "team", "lab") == 1000


@pytest.mark.parametrize(
    "body, field",
    [
        ({"actual_cost": -1}, "actual_cost"),
        ({"actual_cost": "3"}, "actual_cost"),
        ({}, "actual_cost"),
        ({"actual_cost": 1, "refund": 5}, "refund"),
    ],
)
def test_a_bad_commit_is_a_400_and_settles_nothing(lab, decide_client, admin_api_client, body, field):
    rid = reserve(decide_client, 50).json()["id"]
    response = decide_client.post(f"{RESERVE}/{rid}/commit", body, format="json")
    assert response.status_code == 400 and field in response.json()["error"]["fields"]
    assert decide_client.post(f"{RESERVE}/{rid}/cancel").status_code == 200


@pytest.mark.parametrize(
    "body, field",
    [
        ({"keys": KEYS, "cost": 0}, "cost"),
        ({"keys": KEYS, "hold": 0}, "hold"),
        ({"keys": KEYS, "hold": 10**6}, "hold"),
        ({"cost": 3}, "keys"),
    ],
)
def test_a_bad_reservation_is_a_400(lab, decide_client, body, field):
    response = decide_client.post(RESERVE, body, format="json")
    assert response.status_code == 400 and field in response.json()["error"]["fields"]
