"""POST /api/v1/whatif: the traffic the gateways' endpoints recorded (single decisions,
batches, reservations and their settlements), replayed under a draft; its refusals."""

import pytest

from core.recorder import DECISION, RESERVATION, SETTLEMENT, DecisionRecorder
from policies.api.observe import install_decision_recorder, reset_decision_recorder

ACME = {"user": "u1", "team": "acme", "global": "*"}
TEAM_BUCKET = "team: token_bucket({capacity}, 100/s)"


@pytest.fixture
def recorder(api, clock):
    recorder = DecisionRecorder(clock=clock, flush_every=None)
    install_decision_recorder(recorder)
    yield recorder
    reset_decision_recorder()


def draft_team_bucket(capacity):
    return {"tiers": {"pro": {"team": [{"type": "token_bucket", "capacity": capacity, "per_second": 100}]}}}


def test_every_decision_path_records_what_it_decided(recorder, decide_client):
    assert (
        decide_client.post("/api/v1/decisions", {"keys": ACME, "priority": "batch"}, format="json").status_code == 200
    )
    batch = {"requests": [{"keys": ACME}, {"keys": ACME, "cost": 3}]}
    assert decide_client.post("/api/v1/decisions/batch", batch, format="json").status_code == 200
    reserved = decide_client.post("/api/v1/reservations", {"keys": ACME, "cost": 40, "hold": 30}, format="json")
    committed = decide_client.post(
        f"/api/v1/reservations/{reserved.json()['id']}/commit", {"actual_cost": 12}, format="json"
    )
    assert committed.status_code == 200
    kept = recorder.records(0, 2**40)
    assert [(r.kind, r.cost, r.priority) for r in kept] == [
        (DECISION, 1, "batch"),
        (DECISION, 1, None),
        (DECISION, 3, None),
        (RESERVATION, 40, None),
        (SETTLEMENT, 12, None),
    ]
    assert kept[3].ref == kept[4].ref == reserved.json()["id"] and kept[3].hold == 30
    assert all(r.keys == ACME for r in kept[:4])


def test_it_answers_what_a_tighter_draft_would_deny(recorder, decide_client, admin_api_client):
    for _ in range(12):
        decide_client.post("/api/v1/decisions", {"keys": ACME}, format="json")
    decide_client.post("/api/v1/decisions", {"keys": {"user": "u2", "team": "bigco", "global": "*"}}, format="json")
    response = admin_api_client.post("/api/v1/whatif", {"policy": draft_team_bucket(5), "window": "1h"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["tenants"][0] == {
        "tenant": "acme",
        "tier_now": "pro",
        "tier_draft": "pro",
        "decisions": 12,
        "allowed_now": 12,
        "allowed_draft": 5,
        "newly_denied": 7,
        "newly_allowed": 0,
        "blocked_by_draft": {TEAM_BUCKET.format(capacity=5): 7},
    }
    assert body["tenants"][1]["tenant"] == "bigco"  # its override applies: unchanged, listed after
    assert body["totals"]["decisions"] == 13 and body["tenants_total"] == 2
    assert body["window"]["end"] - body["window"]["start"] == 3600


def test_an_empty_window_answers_zeros(recorder, admin_api_client):
    body = admin_api_client.post("/api/v1/whatif", {"policy": {}}, format="json").json()
    assert body["replayed"] == 0 and body["tenants"] == [] and body["totals"]["decisions"] == 0
    assert sum(point["denied_draft"] for point in body["series"]) == 0


@pytest.mark.parametrize(
    "body, status, field",
    [
        ({"policy": draft_team_bucket(-1)}, 400, "policy.tiers.pro.team[0].capacity"),
        ({"policy": {"tenants": {"acme": {"tier": "gold"}}}}, 400, "policy.tenants.acme.tier"),
        (
            {
                "policy": {
                    "tiers": {"pro": {"global": [{"type": "token_bucket", "capacity": 100000, "per_second": 10000}]}}
                }
            },
            409,
            "policy.tiers.pro.global[0]",
        ),  # fmt: skip
        ({"policy": {}, "window": "2d"}, 400, "window"),
        ({"policy": {}, "top": 0}, 400, "top"),
        ({"policy": {}, "tenants": 1}, 400, "tenants"),
        ({"window": "1h"}, 400, "policy"),
        ({"policy": []}, 400, "policy"),
    ],
)
def test_a_bad_request_is_refused_naming_the_field(recorder, admin_api_client, body, status, field):
    response = admin_api_client.post("/api/v1/whatif", body, format="json")
    assert response.status_code == status, response.content
    assert field in response.json()["error"]["fields"], response.json()


def test_recording_off_answers_zeros_and_says_so(api, admin_api_client, decide_client):
    install_decision_recorder(None)
    try:
        decide_client.post("/api/v1/decisions", {"keys": ACME}, format="json")
        body = admin_api_client.post("/api/v1/whatif", {"policy": draft_team_bucket(5)}, format="json").json()
    finally:
        reset_decision_recorder()
    assert body["recording"] is False and body["replayed"] == 0


def test_recording_is_off_when_the_limit_is_zero(settings):
    from policies.api.observe import decision_recorder

    settings.LIMITER_RECORD_LIMIT = 0
    reset_decision_recorder()
    try:
        assert decision_recorder() is None
    finally:
        reset_decision_recorder()
