"""POST /api/v1/decisions and /decisions/batch, over Django's full request stack, against a
real Redis with an injected clock."""

import json

import pytest

from .conftest import make_token, token_client

URL = "/api/v1/decisions"
BATCH = "/api/v1/decisions/batch"
ACME = {"user": "u1", "team": "acme", "global": "*"}


def decide(client, **body):
    return client.post(URL, body, format="json")


def seed_policy(user, team, more=None):
    """A policy with one tier whose user and team rules are given, as seed 003's tests use."""
    return {
        "default_tier": "t",
        "levels": [{"name": "user"}, {"name": "team"}, {"name": "global"}],
        "tiers": {"t": {"user": user, "team": team}},
        **(more or {}),
    }


def bucket(capacity, per_second, **more):
    return {"type": "token_bucket", "capacity": capacity, "per_second": per_second, **more}


# --- answers --------------------------------------------------------------------------------


def test_an_allowed_decision_says_so_with_rate_limit_headers(api, decide_client):
    response = decide(decide_client, keys=ACME, cost=5)
    assert response.status_code == 200
    body = response.json()
    assert body == {
        "allowed": True,
        "retry_after": 0.0,
        "blocked_by": None,
        "reason": "OK",
        "remaining": 45.0,
        "degraded": False,
        "shadow_blocked": [],
        "over_quota": [],
        "lease": None,
    }
    assert response["RateLimit-Policy"].startswith('"user:sliding_window";q=600;w=60, ')
    assert '"team:token_bucket";q=1000;w=10' in response["RateLimit-Policy"]
    assert response["RateLimit"] == '"user:token_bucket";r=45'  # the smallest quota: 50
    assert "Retry-After" not in response


def test_a_denial_names_the_rule_and_carries_retry_after_rounded_up(api, decide_client, clock):
    for _ in range(10):
        assert decide(decide_client, keys={"user": "u9", "team": "nobody"}).json()["allowed"]
    clock.advance(0.25)
    response = decide(decide_client, keys={"user": "u9", "team": "nobody"})
    body = response.json()
    assert response.status_code == 200
    assert body["allowed"] is False
    assert body["blocked_by"] == "user: token_bucket(10, 1/s)"
    assert body["reason"] == "RATE_LIMITED"
    assert body["retry_after"] == pytest.approx(0.75)
    assert response["Retry-After"] == "1"
    assert response["RateLimit"] == '"user:token_bucket";r=0;t=1'


def test_an_unknown_tenant_gets_the_default_tier(api, decide_client):
    body = decide(decide_client, keys={"team": "stranger"}, cost=100).json()
    assert body["allowed"] is True
    body = decide(decide_client, keys={"team": "stranger"}, cost=1).json()
    assert body["blocked_by"] == "team: token_bucket(100, 10/s)"  # free: 100 at the team level


def test_a_cost_that_can_never_fit_has_a_null_retry_after(api, decide_client):
    response = decide(decide_client, keys={"user": "u1"}, cost=11)
    body = response.json()
    assert body["allowed"] is False
    assert body["reason"] == "COST_EXCEEDS_LIMIT"
    assert body["retry_after"] is None
    assert "Retry-After" not in response


def test_a_dry_run_explains_every_rule_and_takes_nothing(api, decide_client):
    decide(decide_client, keys=ACME, cost=40)
    response = decide(decide_client, keys=ACME, cost=20, dry_run=True)
    body = response.json()
    assert body["allowed"] is False and body["dry_run"] is True
    assert body["blocked_by"] == "user: token_bucket(50, 10/s)"
    by_rule = {row["name"]: row for row in body["rules"]}
    assert by_rule["user: token_bucket(50, 10/s)"]["remaining"] == 10
    assert by_rule["user: token_bucket(50, 10/s)"]["wait"] == pytest.approx(1.0)
    assert by_rule["team: token_bucket(1000, 100/s)"]["wait"] == 0
    # Nothing was taken: the real decision for 10 still fits exactly.
    assert decide(decide_client, keys=ACME, cost=10).json()["remaining"] == 0


def test_a_priority_class_keeps_its_watermark_in_reserve(api, decide_client, load, policy_doc):
    policy_doc["global"] = [bucket(100, 0)]
    load(policy_doc)
    api.refresh()
    keys = {"global": "*"}
    assert decide(decide_client, keys=keys, cost=80, priority="batch").json()["allowed"]
    denied = decide(decide_client, keys=keys, cost=1, priority="batch").json()
    assert denied["allowed"] is False and denied["blocked_by"] == "global: token_bucket(100, 0/s)"
    assert decide(decide_client, keys=keys, cost=20, priority="interactive").json()["allowed"]


# --- seed 003's scenarios, over REST ---------------------------------------------------------


@pytest.fixture
def seed_api(engine, load):
    load(seed_policy(user=[bucket(3, 1)], team=[bucket(5, 1)]))
    return engine


def test_seed_a_user_gets_three_then_waits_one_second(seed_api, decide_client, clock):
    keys = {"user": "u1", "team": "t1"}
    answers = [decide(decide_client, keys=keys).json()["allowed"] for _ in range(4)]
    assert answers == [True, True, True, False]
    denied = decide(decide_client, keys=keys).json()
    assert denied["retry_after"] == 1.0 and denied["blocked_by"].startswith("user")
    clock.advance(1.0)
    assert decide(decide_client, keys=keys).json()["allowed"]


def test_seed_a_team_denial_takes_nothing_from_the_user(seed_api, decide_client, admin_api_client):
    for _ in range(3):
        assert decide(decide_client, keys={"user": "a", "team": "t"}).json()["allowed"]
    for _ in range(2):
        assert decide(decide_client, keys={"user": "b", "team": "t"}).json()["allowed"]
    denied = decide(decide_client, keys={"user": "b", "team": "t"}).json()
    assert denied["allowed"] is False and denied["blocked_by"].startswith("team")
    buckets = admin_api_client.get("/api/v1/buckets", {"level": "user", "key": "b"}).json()
    assert buckets["rules"][0]["state"]["tokens"] == 1.0


def test_seed_a_cost_above_the_capacity_never_fits(seed_api, decide_client):
    body = decide(decide_client, keys={"user": "u", "team": "t"}, cost=10).json()
    assert body["reason"] == "COST_EXCEEDS_LIMIT" and body["retry_after"] is None
    assert body["blocked_by"] == "user: token_bucket(3, 1/s)"


def test_seed_a_sliding_window_waits_for_its_oldest_entry(engine, load, decide_client, clock):
    load(
        {
            "default_tier": "t",
            "levels": [{"name": "user"}, {"name": "global"}],
            "tiers": {"t": {"user": [{"type": "sliding_window", "limit": 2, "window": 10}]}},
            "global": [{"type": "fixed_window", "limit": 100, "window": 60}],
        }
    )
    keys = {"user": "u", "global": "*"}
    assert decide(decide_client, keys=keys).json()["allowed"]
    clock.advance(4)
    assert decide(decide_client, keys=keys).json()["allowed"]
    clock.advance(1)
    assert decide(decide_client, keys=keys).json()["retry_after"] == 5
    clock.advance(5)
    assert decide(decide_client, keys=keys).json()["allowed"]


# --- bad input: a 400 that names the field, never a 500 -------------------------------------


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "keys"),
        ({"keys": {}}, "keys"),
        ({"keys": ["u1"]}, "keys"),
        ({"keys": {"planet": "earth"}}, "keys.planet"),
        ({"keys": {"user": ""}}, "keys.user"),
        ({"keys": {"user": 7}}, "keys.user"),
        ({"keys": {"user": "u" * 300}}, "keys.user"),
        ({"keys": {"user": "u"}, "cost": 0}, "cost"),
        ({"keys": {"user": "u"}, "cost": -1}, "cost"),
        ({"keys": {"user": "u"}, "cost": "5"}, "cost"),
        ({"keys": {"user": "u"}, "cost": True}, "cost"),
        ({"keys": {"user": "u"}, "cost": 1e300}, "cost"),
        ({"keys": {"user": "u"}, "priority": "vip"}, "priority"),
        ({"keys": {"user": "u"}, "priority": 3}, "priority"),
        ({"keys": {"user": "u"}, "dry_run": 1}, "dry_run"),
        ({"keys": {"user": "u"}, "kyes": {}}, "kyes"),
    ],
)
def test_a_bad_request_is_a_400_naming_the_field(api, decide_client, body, field):
    response = decide_client.post(URL, body, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert field in error["fields"], error
    assert error["message"].startswith(field)


@pytest.mark.parametrize(
    "raw",
    ['{"keys": ', "[1, 2", '{"keys": {"user": "u"}, "cost": NaN}', '{"keys": {"user": "u"}, "cost": Infinity}', "\xff"],
)
def test_malformed_json_is_a_400(api, decide_client, raw):
    response = decide_client.post(URL, raw, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed_request"


def test_a_body_that_is_not_an_object_is_a_400(api, decide_client):
    response = decide_client.post(URL, "[1, 2]", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"body": "must be a JSON object, not an array"}


def test_a_form_body_is_refused_as_unsupported(api, decide_client):
    response = decide_client.post(URL, {"keys": "x"})  # multipart
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"


def test_an_unknown_api_path_is_a_404_in_the_error_shape(api, decide_client):
    response = decide_client.get("/api/v1/nowhere")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_get_on_decisions_is_a_405(api, decide_client):
    response = decide_client.get(URL)
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"


# --- auth -----------------------------------------------------------------------------------


def test_no_credentials_is_a_401_with_a_bearer_challenge(api, client):
    response = client.post(URL, {"keys": ACME}, content_type="application/json")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert response.json()["error"]["code"] == "not_authenticated"


def test_a_wrong_token_is_a_401(api):
    response = decide(token_client("la_000000000000_nope"), keys=ACME)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"


def test_a_revoked_token_stops_working(api):
    from django.utils import timezone

    from policies.models import ServiceToken

    token = make_token("decide", "old-gateway")
    client = token_client(token)
    assert decide(client, keys=ACME).status_code == 200
    ServiceToken.objects.filter(name="old-gateway").update(revoked_at=timezone.now())
    ServiceToken.objects.get(name="old-gateway").save()  # the admin saves the row: caches drop it
    assert decide(client, keys=ACME).status_code == 401


def test_tokens_are_stored_as_digests_only(api):
    from policies.models import ServiceToken

    token = make_token("admin", "dump-check")
    row = ServiceToken.objects.get(name="dump-check")
    stored = json.dumps([str(v) for v in row.__dict__.values()])
    secret = token.split("_", 2)[-1]  # la_<prefix>_<secret>, and the secret may hold "_" too
    assert token not in stored and secret not in stored


def test_a_staff_session_decides_with_a_csrf_token_only(api, staff_client):
    assert decide(staff_client, keys=ACME).status_code == 403  # no CSRF token
    staff_client.get("/admin/")  # sets the csrftoken cookie
    token = staff_client.cookies["csrftoken"].value
    response = staff_client.post(URL, {"keys": ACME}, format="json", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 200


def test_a_non_staff_session_is_refused(api, django_user_model):
    from rest_framework.test import APIClient

    user = django_user_model.objects.create_user("visitor", password="x")
    client = APIClient()
    client.force_login(user)
    assert decide(client, keys=ACME).status_code == 403


def test_a_decide_token_may_not_read_buckets_or_stats(api, decide_client, admin_api_client):
    for path in ("/api/v1/buckets?level=team&key=acme", "/api/v1/stats/blocked"):
        assert decide_client.get(path).status_code == 403
        assert admin_api_client.get(path).status_code == 200


# --- batches --------------------------------------------------------------------------------


def test_a_batch_answers_in_order_as_if_one_after_the_other(seed_api, decide_client, clock):
    requests = [{"keys": {"user": f"u{i}", "team": "t"}, "cost": 1} for i in range(7)]
    response = decide_client.post(BATCH, {"requests": requests}, format="json")
    assert response.status_code == 200
    batch = [(d["allowed"], d["blocked_by"]) for d in response.json()["decisions"]]
    # The team holds 5: the first five go, then the team blocks.
    assert batch == [(True, None)] * 5 + [(False, "team: token_bucket(5, 1/s)")] * 2


def test_a_batch_equals_the_same_requests_made_one_at_a_time(engine, load, decide_client, redis_store, clock):
    load(seed_policy(user=[bucket(3, 1)], team=[bucket(5, 1)]))
    requests = [{"keys": {"user": f"u{i % 3}", "team": f"t{i % 2}"}, "cost": 1 + i % 2} for i in range(20)]
    batch = decide_client.post(BATCH, {"requests": requests}, format="json").json()["decisions"]
    redis_store.client.flushall()
    single = [decide(decide_client, **request).json() for request in requests]
    assert batch == single


def test_a_batch_names_the_bad_item(api, decide_client):
    requests = [{"keys": ACME}, {"keys": ACME, "cost": -3}]
    response = decide_client.post(BATCH, {"requests": requests}, format="json")
    assert response.status_code == 400
    assert "requests.1.cost" in response.json()["error"]["fields"]


def test_a_batch_of_more_than_a_thousand_is_refused(api, decide_client):
    response = decide_client.post(BATCH, {"requests": [{"keys": ACME}] * 1001}, format="json")
    assert response.status_code == 400
    assert "requests" in response.json()["error"]["fields"]


def test_a_batch_on_redis_is_one_round_trip(seed_api, decide_client, redis_store):
    requests = [{"keys": {"user": f"u{i}", "team": "t"}} for i in range(50)]
    decide_client.post(BATCH, {"requests": requests[:1]}, format="json")  # warm: scripts loaded
    observer = redis_store.client

    def counters():
        stats = observer.info("stats")
        return (observer.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0), stats["total_reads_processed"])

    scripts, reads = counters()
    decide_client.post(BATCH, {"requests": requests}, format="json")
    scripts_after, reads_after = counters()
    assert scripts_after - scripts == 50
    # The server read the 50 calls in one go (one read event; our own two INFO calls add two).
    # Made one at a time, they would be 50 reads.
    assert reads_after - reads <= 2 + 2


def test_remaining_is_null_when_no_rule_applies(memory_engine, load, decide_client):
    load(
        {"default_tier": "t", "levels": [{"name": "user"}, {"name": "team"}], "tiers": {"t": {"team": [bucket(5, 1)]}}}
    )
    response = decide(decide_client, keys={"user": "u"})
    assert response.json()["allowed"] is True and response.json()["remaining"] is None
    assert b"Infinity" not in response.content  # the JSON stays strict
