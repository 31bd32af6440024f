"""GET /api/v1/stats/blocked: denials by blocked_by, the most throttled tenants (denials at any
level) and keys (users with their team), shadow rules' would-be denials, and decisions let go
past a soft quota."""

import pytest

from .test_schema import component, served

SOFT = {"type": "quota", "limit": 100, "period": "day", "mode": "soft"}


def decide(client, keys, cost=1):
    return client.post("/api/v1/decisions", {"keys": keys, "cost": cost}, format="json").json()


def test_denials_are_counted_by_rule_and_key(api, decide_client, admin_api_client):
    for _ in range(13):  # free user bucket: 10, then 3 denials
        decide(decide_client, {"user": "greedy", "team": "nobody"})
    for _ in range(2):
        decide(decide_client, {"team": "acme"}, cost=1001)  # never fits the pro team bucket
    body = admin_api_client.get("/api/v1/stats/blocked", {"window": "5m"}).json()
    assert body["window"] == 300
    assert body["decisions"] == 15 and body["denied"] == 5
    by_rule = {row["blocked_by"]: row["denied"] for row in body["blocked_by"]}
    assert by_rule == {"user: token_bucket(10, 1/s)": 3, "team: token_bucket(1000, 100/s)": 2}
    assert body["top_keys"]["user"][0] == {"key": "greedy", "team": "nobody", "denied": 3}
    assert body["top_keys"]["team"][0] == {"key": "acme", "denied": 2}


def test_acmes_users_denials_make_acme_a_top_tenant(api, decide_client, admin_api_client):
    for user in ("alice", "bob"):
        for _ in range(52):  # pro user burst: 50, then 2 denials each
            decide(decide_client, {"user": user, "team": "acme"})
    for _ in range(13):
        decide(decide_client, {"user": "greedy", "team": "initech"})  # free: 10, then 3 denials
    body = admin_api_client.get("/api/v1/stats/blocked", {"window": "5m"}).json()
    assert body["top_tenants"] == [{"tenant": "acme", "denied": 4}, {"tenant": "initech", "denied": 3}]
    assert "team" not in body["top_keys"]  # nobody was denied at the team level itself


def test_one_user_id_in_two_teams_is_two_rows(api, decide_client, admin_api_client):
    for team, times in (("acme", 53), ("initech", 12)):
        for _ in range(times):
            decide(decide_client, {"user": "shared", "team": team})
    users = admin_api_client.get("/api/v1/stats/blocked", {"window": "5m"}).json()["top_keys"]["user"]
    assert users == [
        {"key": "shared", "team": "acme", "denied": 3},
        {"key": "shared", "team": "initech", "denied": 2},
    ]


def test_shadow_rules_would_be_denials_are_counted_by_rule(engine, load, policy_doc, decide_client, admin_api_client):
    policy_doc["tiers"]["free"]["user"].append({"type": "fixed_window", "limit": 2, "window": 60, "shadow": True})
    load(policy_doc)
    for _ in range(5):
        assert decide(decide_client, {"user": "u1", "team": "nobody"})["allowed"]
    body = admin_api_client.get("/api/v1/stats/blocked", {"window": "5m"}).json()
    assert body["denied"] == 0 and body["shadow_denied"] == 3
    assert body["embedded"] == body["embedded_denied"] == 0  # decided over the API, not in an app
    assert body["shadow_blocked_by"] == [{"blocked_by": "user: fixed_window(2/60s)", "level": "user", "denied": 3}]


def test_decisions_past_a_soft_quota_are_counted_by_quota(engine, load, policy_doc, decide_client, admin_api_client):
    policy_doc["tiers"]["pro"]["team"].append(SOFT)
    load(policy_doc)
    answers = [decide(decide_client, {"team": "acme"}, cost=60) for _ in range(4)]
    assert [len(answer["over_quota"]) for answer in answers] == [0, 1, 1, 1]  # 60 fits in 100, 120 does not
    [quota] = answers[-1]["over_quota"]
    body = admin_api_client.get("/api/v1/stats/blocked", {"window": "5m"}).json()
    assert (body["decisions"], body["denied"], body["over_quota"]) == (4, 0, 3)
    assert body["over_quota_by"] == [{"blocked_by": quota, "level": "team", "denied": 3}]
    assert sum(point["over_quota"] for point in body["series"]) == 3


def test_every_field_of_the_report_is_in_its_schema(api, decide_client, admin_api_client):
    decide(decide_client, {"user": "u1", "team": "acme"})
    body = admin_api_client.get("/api/v1/stats/blocked", {"window": "5m"}).json()
    schema = served(admin_api_client)
    assert set(body) == set(component(schema, "BlockedReport")["properties"])
    assert set(body["series"][-1]) == set(component(schema, "BlockedPoint")["properties"])


def test_old_denials_leave_the_window(api, decide_client, admin_api_client, clock):
    for _ in range(11):
        decide(decide_client, {"user": "early", "team": "nobody"})
    clock.advance(6 * 60)
    body = admin_api_client.get("/api/v1/stats/blocked", {"window": "5m"}).json()
    assert body["denied"] == 0
    assert admin_api_client.get("/api/v1/stats/blocked", {"window": "1h"}).json()["denied"] == 1


@pytest.mark.parametrize(
    "query, field",
    [
        ({"window": "0"}, "window"),
        ({"window": "2d"}, "window"),
        ({"window": "soon"}, "window"),
        ({"top": "0"}, "top"),
        ({"top": "many"}, "top"),
        ({"top": "1000"}, "top"),
    ],
)
def test_a_bad_stats_query_names_the_parameter(api, admin_api_client, query, field):
    response = admin_api_client.get("/api/v1/stats/blocked", query)
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
