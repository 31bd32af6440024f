"""GET /api/v1/stats/blocked: denials by blocked_by and the most throttled keys."""

import pytest


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
    assert body["top_keys"]["user"][0] == {"key": "greedy", "denied": 3}
    assert body["top_keys"]["team"][0] == {"key": "acme", "denied": 2}


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
