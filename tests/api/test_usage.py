"""GET /api/v1/tenants/{key}/usage: a tenant's decisions, allowed, denied, shadow-denied, over
a soft quota and cost per minute or per hour, its blocked_by, shadow rules and soft quotas gone
over, and its most throttled users; on a real Redis, with a clock that moves only when told."""

import pytest

from .test_schema import component, served
from .test_stats import SOFT, decide

USAGE = "/api/v1/tenants/{}/usage"


def usage(client, key, **query):
    response = client.get(USAGE.format(key), query)
    assert response.status_code == 200, response.content
    return response.json()


def test_a_tenants_minutes_over_24_hours(api, decide_client, admin_api_client, clock):
    for _ in range(52):  # pro user burst: 50, then 2 denials
        decide(decide_client, {"user": "alice", "team": "acme"}, cost=1)
    decide(decide_client, {"user": "bob", "team": "acme"}, cost=3)
    decide(decide_client, {"user": "carl", "team": "initech"})
    body = usage(admin_api_client, "acme", window="24h", step="1m")
    assert (body["tenant"], body["tier"], body["window"], body["step"]) == ("acme", "pro", 86400, 60)
    assert len(body["series"]) == 24 * 60 + 1
    last = body["series"][-1]
    assert last == {
        "start": int(clock() // 60) * 60,
        "decisions": 53,
        "allowed": 51,
        "denied": 2,
        "shadow_denied": 0,
        "over_quota": 0,
        "cost": 53,
    }
    assert body["blocked_by"] == {"user: token_bucket(50, 10/s)": 2}
    assert body["shadow_blocked_by"] == body["over_quota_by"] == {}
    assert body["top_users"] == [
        {"user": "alice", "decisions": 52, "denied": 2},
        {"user": "bob", "decisions": 1, "denied": 0},
    ]


def test_a_tenants_hours_over_30_days(api, decide_client, admin_api_client, clock):
    decide(decide_client, {"team": "acme"}, cost=2)
    clock.advance(3 * 86400)
    decide(decide_client, {"team": "acme"}, cost=5)
    body = usage(admin_api_client, "acme", window="30d", step="1h")
    assert body["step"] == 3600 and len(body["series"]) == 30 * 24 + 1
    assert [(p["decisions"], p["cost"]) for p in body["series"] if p["decisions"]] == [(1, 2), (1, 5)]


def test_a_tenants_decisions_past_a_soft_quota_per_minute_and_per_hour(
    engine, load, policy_doc, decide_client, admin_api_client, clock
):
    policy_doc["tiers"]["pro"]["team"].append(SOFT)
    load(policy_doc)
    for _ in range(3):
        decide(decide_client, {"team": "acme"}, cost=60)  # the second and third go past 100 a day
    clock.advance(3600 + 600)  # ten minutes into the next hour
    [quota] = decide(decide_client, {"team": "acme"}, cost=1)["over_quota"]
    minutes = usage(admin_api_client, "acme", window="2h", step="1m")
    assert [point["over_quota"] for point in minutes["series"] if point["over_quota"]] == [2, 1]
    assert minutes["over_quota_by"] == {quota: 3}
    hours = usage(admin_api_client, "acme", window="30d", step="1h")
    assert [point["over_quota"] for point in hours["series"][-2:]] == [2, 1]
    assert hours["over_quota_by"] == {quota: 3}
    assert usage(admin_api_client, "acme", window="5m")["over_quota_by"] == {quota: 1}  # this hour's alone


def test_every_field_of_a_usage_is_in_its_schema(api, decide_client, admin_api_client):
    decide(decide_client, {"user": "u1", "team": "acme"})
    body = usage(admin_api_client, "acme", window="1h")
    schema = served(admin_api_client)
    assert set(body) == set(component(schema, "TenantUsage")["properties"])
    assert set(body["series"][-1]) == set(component(schema, "UsagePoint")["properties"])


def test_the_step_follows_the_window_when_not_given(api, decide_client, admin_api_client):
    decide(decide_client, {"team": "acme"})
    assert usage(admin_api_client, "acme", window="1h")["step"] == 60
    assert usage(admin_api_client, "acme", window="7d")["step"] == 3600
    assert usage(admin_api_client, "acme")["window"] == 86400


def test_a_team_key_with_traffic_but_no_tenant_row_has_the_default_tier(api, decide_client, admin_api_client):
    decide(decide_client, {"user": "u1", "team": "newco"})
    assert usage(admin_api_client, "newco")["tier"] == "free"


def test_a_team_key_holding_a_slash_is_read_whole(api, decide_client, admin_api_client):
    decide(decide_client, {"team": "eu/acme"})
    assert usage(admin_api_client, "eu/acme")["tenant"] == "eu/acme"
    # The tenant's own route is still the tenant's.
    assert admin_api_client.get("/api/v1/tenants/acme").json()["key"] == "acme"


def test_an_unknown_tenant_without_traffic_is_a_404(api, admin_api_client):
    response = admin_api_client.get(USAGE.format("nobody-at-all"))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_a_known_tenant_without_traffic_has_an_empty_series(api, admin_api_client):
    body = usage(admin_api_client, "bigco", window="1h")
    assert sum(point["decisions"] for point in body["series"]) == 0 and body["tier"] == "pro"


@pytest.mark.parametrize(
    "query, field",
    [
        ({"window": "0"}, "window"),
        ({"window": "31d"}, "window"),
        ({"window": "soon"}, "window"),
        ({"step": "5m"}, "step"),
        ({"step": "60"}, "step"),
    ],
)
def test_a_bad_window_or_step_is_a_400_naming_it(api, admin_api_client, query, field):
    response = admin_api_client.get(USAGE.format("acme"), query)
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]


def test_a_minute_step_over_more_than_the_minutes_kept_covers_the_minutes_kept(api, decide_client, admin_api_client):
    # Any window the schema allows is answered (no 400 for a pair of valid parameters): the
    # series of minutes starts where the minutes kept start, and `window` says so.
    decide(decide_client, {"user": "alice", "team": "acme"})
    body = usage(admin_api_client, "acme", window="6d", step="1m")
    assert (body["window"], body["step"], len(body["series"])) == (86400, 60, 24 * 60 + 1)
    assert sum(point["decisions"] for point in body["series"]) == 1


def test_only_operators_read_usage(api, decide_client, client):
    assert decide_client.get(USAGE.format("acme")).status_code == 403
    assert client.get(USAGE.format("acme")).status_code == 401
