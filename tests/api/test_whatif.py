"""POST /api/v1/whatif: the traffic the gateways' endpoints recorded (single decisions,
batches, reservations and their settlements), replayed under a draft; its refusals."""

import threading

import pytest

from core.recorder import DECISION, RESERVATION, SETTLEMENT, DecisionRecorder, Record
from policies.telemetry import install_decision_recorder, reset_decision_recorder

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
        ({"policy": {"tiers": {"pro": {"user": [], "team": [], "global": []}}}}, 409, "policy.tiers.pro"),
        ({"policy": {"tiers": {"new": {"user": []}}}}, 400, "policy.tiers.new"),
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
    from policies.telemetry import decision_recorder

    settings.LIMITER_RECORD_LIMIT = 0
    reset_decision_recorder()
    try:
        assert decision_recorder() is None
    finally:
        reset_decision_recorder()


# --- bounds: a what-if cannot hold what the gateways need (issue 26) --------------------------


def test_a_draft_past_the_caps_is_refused_naming_the_cap(recorder, admin_api_client, settings):
    settings.LIMITER_WHATIF_MAX_TENANTS = 2
    settings.LIMITER_WHATIF_MAX_RULES = 3
    tenants = {"policy": {"tenants": {f"t{i}": {"tier": "pro"} for i in range(3)}}}
    response = admin_api_client.post("/api/v1/whatif", tenants, format="json")
    assert response.status_code == 400
    assert (
        "at most 2 tenants (LIMITER_WHATIF_MAX_TENANTS), got 3" in response.json()["error"]["fields"]["policy.tenants"]
    )
    rule = {"type": "token_bucket", "capacity": 5, "per_second": 1}
    rules = {"policy": {"tiers": {"pro": {"team": [rule] * 2}}, "global": [rule, rule]}}
    response = admin_api_client.post("/api/v1/whatif", rules, format="json")
    assert response.status_code == 400
    assert "at most 3 rules (LIMITER_WHATIF_MAX_RULES), got 4" in response.json()["error"]["fields"]["policy"]


def test_a_full_queue_is_a_503_with_retry_after_and_replays_nothing(recorder, admin_api_client):
    from policies.services.whatif import REPLAYS

    release = threading.Event()
    held = [REPLAYS.submit(release.wait, 30) for _ in range(REPLAYS.workers + REPLAYS.waiting)]
    try:
        response = admin_api_client.post("/api/v1/whatif", {"policy": draft_team_bucket(5)}, format="json")
    finally:
        release.set()
        for job in held:
            job.result(30)
    assert response.status_code == 503 and int(response["Retry-After"]) >= 1
    assert response.json()["error"]["code"] == "busy"


def test_while_every_replay_slot_is_taken_a_replay_waits_then_says_busy(recorder, admin_api_client, settings):
    from policies.services.whatif import replay_slot

    settings.LIMITER_WHATIF_SECONDS = 1  # how long a replay waits for a slot, too
    taken, release = threading.Event(), threading.Event()

    def hold():
        with replay_slot(wait=5):
            taken.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert taken.wait(10)
        response = admin_api_client.post("/api/v1/whatif", {"policy": draft_team_bucket(5)}, format="json")
    finally:
        release.set()
        holder.join(30)
    assert response.status_code == 503 and response.json()["error"]["code"] == "busy"
    assert "LIMITER_WHATIF_CONCURRENCY" in response.json()["error"]["message"]
    # The slot is back: the next replay runs.
    assert admin_api_client.post("/api/v1/whatif", {"policy": {}}, format="json").status_code == 200


def test_a_replay_past_its_time_is_stopped_and_names_the_window(recorder, admin_api_client, settings, clock):
    settings.LIMITER_WHATIF_SECONDS = 1
    # 400,000 decisions in the window: seconds of replay under each policy, far past 1 s.
    now = clock()
    recorder.log.write(
        [Record(now - 1800 + i * 0.004, DECISION, {"user": f"u{i % 900}", "team": "acme"}) for i in range(400_000)]
    )
    response = admin_api_client.post("/api/v1/whatif", {"policy": draft_team_bucket(5)}, format="json")
    assert response.status_code == 400
    assert "longer than the 1 s a replay may take" in response.json()["error"]["fields"]["window"]
