"""Concurrency slots over REST: a decision that took one answers its `lease`;
POST /api/v1/leases/{lease}/release hands it back once; the Python client releases it."""

import pytest

from core.client import LimiterClient, RateLimited
from core.recorder import RELEASE, DecisionRecorder
from policies.services.leases import ticket
from policies.telemetry import install_decision_recorder, reset_decision_recorder

from .conftest import make_token

DECIDE = "/api/v1/decisions"
BATCH = "/api/v1/decisions/batch"
KEYS = {"user": "u1", "team": "lab"}
POLICY = {
    "default_tier": "t",
    "levels": [{"name": "user"}, {"name": "team"}],
    "tiers": {
        "t": {
            "user": [{"type": "token_bucket", "capacity": 100, "per_second": 0}],
            "team": [{"type": "concurrency", "limit": 2, "lease": 30}],
        }
    },
}


@pytest.fixture
def lab(engine, load):
    load(POLICY)
    return engine


def decide(client, keys=KEYS):
    return client.post(DECIDE, {"keys": keys}, format="json").json()


def release(client, lease):
    return client.post(f"/api/v1/leases/{lease}/release", format="json")


def in_flight(client):
    rules = client.get("/api/v1/buckets", {"level": "team", "key": "lab"}).json()["rules"]
    return rules[0]["state"]["in_flight"]


def test_a_decision_that_took_a_slot_answers_its_lease(lab, decide_client, admin_api_client):
    body = decide(decide_client)
    assert body["allowed"] is True and isinstance(body["lease"], str)
    assert in_flight(admin_api_client) == 1


def test_a_decision_without_a_concurrency_rule_answers_a_null_lease(api, decide_client):
    body = decide(decide_client, {"user": "u1", "team": "acme"})
    assert body["allowed"] is True and body["lease"] is None


def test_a_denied_decision_holds_no_slot(lab, decide_client):
    decide(decide_client), decide(decide_client)
    denied = decide(decide_client)
    assert denied["allowed"] is False and denied["lease"] is None
    assert denied["blocked_by"].startswith("team: concurrency(2")


def test_a_dry_run_holds_no_slot(lab, decide_client, admin_api_client):
    body = decide_client.post(DECIDE, {"keys": KEYS, "dry_run": True}, format="json").json()
    assert body["lease"] is None and in_flight(admin_api_client) == 0


def test_a_release_frees_the_slot_for_the_next_request(lab, decide_client, admin_api_client):
    first, _ = decide(decide_client), decide(decide_client)
    assert decide(decide_client)["allowed"] is False
    response = release(decide_client, first["lease"])
    assert response.status_code == 200
    assert response.json() == {"id": first["lease"], "status": "released", "released": 1}
    assert in_flight(admin_api_client) == 1
    assert decide(decide_client)["allowed"] is True


def test_a_second_release_is_a_404_and_releases_nothing(lab, decide_client, admin_api_client):
    first, second = decide(decide_client), decide(decide_client)
    assert release(decide_client, first["lease"]).status_code == 200
    again = release(decide_client, first["lease"])
    assert again.status_code == 404
    assert again.json()["error"]["code"] == "not_found" and "id" in again.json()["error"]["fields"]
    assert in_flight(admin_api_client) == 1  # the second decision's slot is still held
    assert second["lease"] != first["lease"]


def test_a_release_after_the_lease_ran_out_is_a_404(lab, decide_client, admin_api_client, clock):
    body = decide(decide_client)
    clock.advance(30.5)
    assert release(decide_client, body["lease"]).status_code == 404
    assert in_flight(admin_api_client) == 0


@pytest.mark.parametrize("lease", ["nonsense", "a.b.c", "0123456789ab-1.e30.AAAAAAAAAAAAAAAAAAAAAA"])
def test_an_id_it_never_gave_is_a_404(lab, decide_client, lease):
    response = release(decide_client, lease)
    assert response.status_code == 404 and response.json()["error"]["fields"] == {
        "id": response.json()["error"]["fields"]["id"]
    }


def test_a_forged_id_for_someone_elses_slot_is_a_404(lab, decide_client, admin_api_client):
    real = decide(decide_client)["lease"]
    engine_lease = real.split(".")[0]
    forged = ticket({"user": "u1", "team": "lab"}, engine_lease).split(".")
    forged[2] = "B" * len(forged[2])
    assert release(decide_client, ".".join(forged)).status_code == 404
    assert in_flight(admin_api_client) == 1


def test_a_release_takes_no_body_fields(lab, decide_client):
    lease = decide(decide_client)["lease"]
    response = decide_client.post(f"/api/v1/leases/{lease}/release", {"cost": 1}, format="json")
    assert response.status_code == 400 and "cost" in response.json()["error"]["fields"]


def test_a_release_needs_a_token(lab, decide_client, client):
    lease = decide(decide_client)["lease"]
    assert client.post(f"/api/v1/leases/{lease}/release").status_code == 401


def test_each_batch_item_that_took_a_slot_answers_its_own_lease(lab, decide_client, admin_api_client):
    response = decide_client.post(BATCH, {"requests": [{"keys": KEYS}] * 3}, format="json")
    decisions = response.json()["decisions"]
    assert [d["allowed"] for d in decisions] == [True, True, False]
    leases = [d["lease"] for d in decisions]
    assert leases[0] and leases[1] and leases[0] != leases[1] and leases[2] is None
    assert release(decide_client, leases[1]).status_code == 200
    assert in_flight(admin_api_client) == 1


def test_a_release_is_recorded_for_the_what_if(lab, decide_client, clock):
    recorder = DecisionRecorder(clock=clock, flush_every=None)
    install_decision_recorder(recorder)
    try:
        lease = decide(decide_client)["lease"]
        release(decide_client, lease)
        release(decide_client, lease)  # not held any more: nothing to record
        records = recorder.records(0, clock() + 1)
    finally:
        reset_decision_recorder()
    decision, released = records
    assert released.kind == RELEASE and released.ref == decision.ref == lease.split(".")[0]
    assert released.keys == KEYS


def test_the_schema_describes_the_lease_and_its_release(lab, admin_api_client):
    schema = admin_api_client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    assert "lease" in schema["components"]["schemas"]["GatewayDecision"]["properties"]
    operation = schema["paths"]["/api/v1/leases/{lease}/release"]["post"]
    assert {"200", "400", "401", "403", "404"} <= set(operation["responses"])


# The Python client ---------------------------------------------------------------------------


@pytest.fixture
def remote(live_server, memory_engine, load):
    load(POLICY)
    with LimiterClient(live_server.url, make_token("decide")) as client:
        yield client


def test_the_client_releases_a_lease_once(remote):
    decision = remote.decide(KEYS)
    assert decision.lease is not None
    assert remote.release(decision.lease) is True
    assert remote.release(decision.lease) is False
    assert remote.release(None) is False


def test_the_clients_slot_releases_on_exit_even_when_the_body_fails(remote):
    with remote.slot(KEYS) as decision:
        assert decision.allowed and decision.lease
    with pytest.raises(RuntimeError):
        with remote.slot(KEYS):
            raise RuntimeError("the model call failed")
    # Both slots came back: two more fit in a limit of 2.
    held = [remote.decide(KEYS), remote.decide(KEYS)]
    assert all(d.allowed for d in held)
    with pytest.raises(RateLimited) as raised:
        remote.slot(KEYS)
    assert raised.value.decision.blocked_by.startswith("team: concurrency(2")
