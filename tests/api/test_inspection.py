"""GET /api/v1/buckets, the probes, /metrics and the OpenAPI schema."""

import pytest

ACME = {"user": "u1", "team": "acme", "global": "*"}


def decide(client, keys, cost=1):
    return client.post("/api/v1/decisions", {"keys": keys, "cost": cost}, format="json").json()


def test_buckets_show_every_rule_of_a_key_with_its_origin_and_live_state(api, decide_client, admin_api_client):
    decide(decide_client, ACME, cost=30)
    body = admin_api_client.get("/api/v1/buckets", {"level": "user", "key": "u1", "team": "acme"}).json()
    assert body["tier"] == "pro" and body["tenant"] == "acme" and body["override"] is False
    by_rule = {rule["rule"]: rule for rule in body["rules"]}
    assert set(by_rule) == {"sliding_window(600/60s)", "token_bucket(50, 10/s)"}
    assert by_rule["token_bucket(50, 10/s)"]["state"]["tokens"] == 20
    assert by_rule["token_bucket(50, 10/s)"]["state"]["full_in"] == 3
    assert by_rule["token_bucket(50, 10/s)"]["label"] == "BURST_LIMIT"
    assert {rule["source"] for rule in body["rules"]} == {"tier: pro"}


def test_buckets_of_a_tenant_with_an_override_say_where_each_rule_comes_from(api, admin_api_client):
    body = admin_api_client.get("/api/v1/buckets", {"level": "team", "key": "bigco"}).json()
    assert body["override"] is True
    assert [(rule["rule"], rule["source"]) for rule in body["rules"]] == [
        ("token_bucket(600, 10/s)", "override: bigco")
    ]
    body = admin_api_client.get("/api/v1/buckets", {"level": "global", "key": "*"}).json()
    assert [(rule["rule"], rule["source"]) for rule in body["rules"]] == [("token_bucket(100000, 10000/s)", "global")]


def test_a_bucket_in_debt_shows_its_negative_balance_and_when_it_is_back_above_zero(
    api, decide_client, admin_api_client
):
    reserved = decide_client.post("/api/v1/reservations", {"keys": {"team": "acme"}, "cost": 10}, format="json")
    commit = f"/api/v1/reservations/{reserved.json()['id']}/commit"
    assert decide_client.post(commit, {"actual_cost": 1300}, format="json").status_code == 200
    state = admin_api_client.get("/api/v1/buckets", {"level": "team", "key": "acme"}).json()["rules"][0]["state"]
    assert (state["tokens"], state["remaining"]) == (-300, 0)
    assert (state["debt_clears_in"], state["full_in"]) == (3, 13)


def test_an_untouched_bucket_is_full(api, admin_api_client):
    body = admin_api_client.get("/api/v1/buckets", {"level": "team", "key": "acme"}).json()
    assert body["rules"][0]["state"]["tokens"] == 1000
    assert body["rules"][0]["state"]["full_in"] == 0


@pytest.mark.parametrize(
    "query, field",
    [
        ({"key": "acme"}, "level"),
        ({"level": "team"}, "key"),
        ({"level": "planet", "key": "x"}, "level"),
        ({"level": "team", "key": "k" * 300}, "key"),
    ],
)
def test_a_bad_bucket_query_names_the_parameter(api, admin_api_client, query, field):
    response = admin_api_client.get("/api/v1/buckets", query)
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]


def test_readyz_is_ready_when_database_and_store_answer(api, client):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "database": "ok", "store": "ok"}


def test_readyz_is_503_when_the_store_is_down(db, client, unreachable_redis_url):
    from core.stores.redis import RedisStore
    from policies.compile import PolicyCache, install_policy_cache

    store = RedisStore(url=unreachable_redis_url)
    install_policy_cache(PolicyCache(store=store))
    try:
        response = client.get("/readyz")
    finally:
        install_policy_cache(None)
    assert response.status_code == 503
    assert response.json()["store"].startswith("unreachable")
    assert response.json()["database"] == "ok"


def test_metrics_count_decisions_by_result_level_and_reason(api, decide_client, client):
    def count(text, labels):
        for line in text.splitlines():
            if line.startswith("limiter_decisions_total{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before = client.get("/metrics").content.decode()
    for _ in range(12):
        decide(decide_client, {"user": "m1", "team": "nobody"})
    after = client.get("/metrics").content.decode()
    denied = {"result": "denied", "level": "user", "reason": "RATE_LIMITED"}
    assert count(after, denied) - count(before, denied) == 2
    allowed = {"result": "allowed", "reason": "OK"}
    assert count(after, allowed) - count(before, allowed) == 10


def test_the_schema_is_valid_openapi_and_lists_every_endpoint(api, client):
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.validation import validate_schema

    schema = SchemaGenerator().get_schema(request=None, public=True)
    validate_schema(schema)
    for path in (
        "/api/v1/decisions",
        "/api/v1/decisions/batch",
        "/api/v1/reservations",
        "/api/v1/reservations/{reservation_id}/commit",
        "/api/v1/buckets",
        "/api/v1/stats/blocked",
    ):
        assert path in schema["paths"], path
    assert schema["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    assert client.get("/api/schema/").status_code == 200
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    assert b"cdn" not in docs.content.lower()  # the docs page's scripts are served by us


def test_the_request_parser_and_the_schema_agree_on_the_decision_fields():
    from policies.api import schemas
    from policies.services import inputs

    assert set(schemas.DecisionRequest().fields) == set(inputs.DECISION_FIELDS)
    assert set(schemas.ReservationRequest().fields) == set(inputs.RESERVATION_FIELDS)
