"""A tenant's budgets over REST: GET /api/v1/tenants/{key}/quotas (used, remaining, when it
resets and runs out, in the quota's own time zone) and POST /api/v1/tenants/{key}/credits
(a top-up of a balance, recorded with who and how much)."""

import datetime as dt

import pytest

from policies.models import CreditTopUp

ACME = {"team": "acme", "global": "*"}  # no user: the tier's user buckets hold 50 at most
MONTHLY = {"type": "quota", "limit": 1000, "period": "month", "timezone": "America/New_York", "label": "MONTHLY"}
CREDITS = {"type": "quota", "limit": 500, "period": "none", "label": "CREDITS"}


@pytest.fixture
def quotas(policy_doc, api_with):
    policy_doc["tiers"]["pro"]["team"] = [*policy_doc["tiers"]["pro"]["team"], MONTHLY, CREDITS]
    return api_with(policy_doc)


@pytest.fixture
def api_with(engine, load):
    def loaded(doc):
        load(doc)
        return engine

    return loaded


def spend(client, cost: float) -> dict:
    response = client.post("/api/v1/decisions", {"keys": ACME, "cost": cost}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def test_a_tenants_quotas_say_what_is_used_and_when_it_resets_in_their_time_zone(
    quotas, decide_client, admin_api_client, clock
):
    spend(decide_client, 100)
    spend(decide_client, 50)
    body = admin_api_client.get("/api/v1/tenants/acme/quotas").json()
    assert body["tenant"] == "acme"
    monthly, credits = body["quotas"]
    assert (monthly["mode"], monthly["period"], monthly["timezone"]) == ("hard", "month", "America/New_York")
    assert monthly["label"] == "MONTHLY" and monthly["limit"] == 1000
    assert monthly["used"] == 150 and monthly["remaining"] == 850
    start = dt.datetime.fromisoformat(monthly["period_start"])
    resets = dt.datetime.fromisoformat(monthly["resets_at"])
    # New York's month: midnight local, with New York's offset (-05:00 in winter, -04:00 in summer).
    assert start.utcoffset() in (dt.timedelta(hours=-5), dt.timedelta(hours=-4))
    assert (start.day, start.hour, start.minute) == (1, 0, 0) and (resets.day, resets.hour) == (1, 0)
    assert start <= dt.datetime.fromtimestamp(clock(), dt.UTC) < resets
    assert credits["period"] == "none" and credits["period_start"] is None and credits["resets_at"] is None
    assert credits["used"] == 150 and credits["remaining"] == 350


def test_a_quota_spent_at_a_pace_shows_when_it_runs_out(quotas, decide_client, admin_api_client, clock):
    clock.advance(3600)
    spend(decide_client, 100)
    monthly = admin_api_client.get("/api/v1/tenants/acme/quotas").json()["quotas"][0]
    exhaustion = monthly["projected_exhaustion"]
    if exhaustion is not None:  # at this pace within the month: after now, before it resets
        moment = dt.datetime.fromisoformat(exhaustion).timestamp()
        assert clock() < moment <= dt.datetime.fromisoformat(monthly["resets_at"]).timestamp()


def test_a_top_up_adds_to_the_balance_and_is_recorded_with_who_and_how_much(quotas, decide_client, admin_api_client):
    spend(decide_client, 400)
    assert spend(decide_client, 200)["allowed"] is False  # 100 left of the credits
    top_up = {"level": "team", "rule": "CREDITS", "add": 300}
    response = admin_api_client.post("/api/v1/tenants/acme/credits", top_up, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["balance"] == 400 and response.json()["added"] == 300
    assert spend(decide_client, 200)["allowed"] is True
    record = CreditTopUp.objects.get()
    assert (record.tenant_key, record.amount, record.balance) == ("acme", 300, 400)
    assert record.by == "token:ops-script"


@pytest.mark.parametrize(
    "body, status, field",
    [
        ({"level": "team", "rule": "MONTHLY", "add": 5}, 409, "rule"),  # not a balance of credits
        ({"level": "team", "rule": "NOPE", "add": 5}, 404, "rule"),
        ({"level": "team", "rule": 99, "add": 5}, 404, "rule"),
        ({"level": "team", "rule": "CREDITS", "add": -5}, 400, "add"),
        ({"level": "team", "rule": "CREDITS", "add": "5"}, 400, "add"),
        ({"level": "planet", "rule": "CREDITS", "add": 5}, 400, "level"),
        ({"level": "user", "rule": "CREDITS", "add": 5}, 400, "level"),
        ({"rule": "CREDITS", "add": 5}, 400, "level"),
        ({"level": "team", "rule": "CREDITS", "add": 5, "extra": 1}, 400, "extra"),
    ],
)
def test_a_bad_top_up_names_the_field_and_records_nothing(quotas, admin_api_client, body, status, field):
    response = admin_api_client.post("/api/v1/tenants/acme/credits", body, format="json")
    assert response.status_code == status, response.content
    assert field in response.json()["error"]["fields"]
    assert not CreditTopUp.objects.exists()


def test_only_operators_read_quotas_or_top_up(quotas, decide_client):
    assert decide_client.get("/api/v1/tenants/acme/quotas").status_code == 403
    credits = {"level": "team", "rule": "CREDITS", "add": 5}
    assert decide_client.post("/api/v1/tenants/acme/credits", credits, format="json").status_code == 403


def test_a_tenant_without_quotas_has_none(api, admin_api_client):
    assert admin_api_client.get("/api/v1/tenants/acme/quotas").json() == {"tenant": "acme", "quotas": []}


SOFT = {"type": "quota", "limit": 100, "period": "day", "mode": "soft", "label": "DAILY_SOFT"}


def test_a_request_past_a_soft_quota_goes_and_says_so_in_the_body_and_a_header(policy_doc, api_with, decide_client):
    policy_doc["tiers"]["pro"]["team"] = [*policy_doc["tiers"]["pro"]["team"], SOFT]
    api_with(policy_doc)
    under = decide_client.post("/api/v1/decisions", {"keys": ACME, "cost": 60}, format="json")
    assert under.json()["over_quota"] == [] and "X-Limiter-Over-Quota" not in under
    over = decide_client.post("/api/v1/decisions", {"keys": ACME, "cost": 60}, format="json")
    body = over.json()
    assert body["allowed"] is True
    [name] = body["over_quota"]
    assert name.startswith("team: quota(100/day") and over["X-Limiter-Over-Quota"] == f'"{name}"'
    batch = decide_client.post("/api/v1/decisions/batch", {"requests": [{"keys": ACME}]}, format="json").json()
    assert batch["decisions"][0]["over_quota"] == [name]


def test_past_a_soft_quota_with_demote_to_a_request_keeps_to_the_classes_watermark(policy_doc, api_with, decide_client):
    """Under `batch` (a watermark of 0.5 at the team level here) a request over the soft
    quota may not take the team bucket below half, where one within it may."""
    policy_doc["priorities"] = {"batch": {"watermark": 0.5, "levels": ["team"]}}
    policy_doc["tiers"]["pro"]["team"] = [
        {"type": "token_bucket", "capacity": 1000, "per_second": 0},
        {**SOFT, "demote_to": "batch"},
    ]
    api_with(policy_doc)
    assert spend(decide_client, 100)["allowed"]  # within the soft quota: all of the bucket may go
    assert spend(decide_client, 300)["allowed"]  # now past it, demoted, but 600 left >= 500 kept
    refused = spend(decide_client, 200)  # demoted again: 400 would be left, below the 500 kept
    assert refused["allowed"] is False and refused["blocked_by"].startswith("team: token_bucket(1000")


def test_a_quota_demoting_to_a_class_the_policy_has_not_is_refused_naming_the_field(
    policy_doc, api_with, admin_api_client
):
    api_with(policy_doc)
    tier = {"name": "gold", "rules": {"team": [{**SOFT, "demote_to": "bulk"}]}}
    response = admin_api_client.post("/api/v1/tiers", tier, format="json")
    assert response.status_code == 400
    [(field, reason)] = response.json()["error"]["fields"].items()
    assert field.endswith("team[0].demote_to") or field.endswith("team.0.demote_to"), field
    assert "unknown priority class 'bulk'" in reason


def test_a_priority_class_a_quota_demotes_to_is_not_deleted(policy_doc, api_with, admin_api_client):
    policy_doc["tiers"]["pro"]["team"] = [*policy_doc["tiers"]["pro"]["team"], {**SOFT, "demote_to": "batch"}]
    api_with(policy_doc)
    response = admin_api_client.delete("/api/v1/priorities/batch")
    assert response.status_code == 409 and "demote to" in response.json()["error"]["message"]


def test_a_policy_file_naming_an_unknown_class_in_demote_to_is_refused_at_its_path(policy_doc):
    from core import ConfigError
    from policies.policyfile import check_document

    policy_doc["tiers"]["pro"]["team"] = [{**SOFT, "demote_to": "bulk"}]
    with pytest.raises(ConfigError) as refused:
        check_document(policy_doc)
    assert refused.value.path == "tiers.pro.team[0].demote_to"


def test_quota_rules_go_through_crud_and_read_back_as_written(api, admin_api_client):
    rules = {
        "team": [
            {"type": "quota", "limit": 10_000_000, "period": "month", "timezone": "Asia/Kolkata", "label": "MONTH"},
            {"type": "quota", "limit": 100_000, "period": "day", "mode": "soft", "demote_to": "batch"},
            {"type": "quota", "limit": 2_000_000, "period": "none"},
        ]
    }
    response = admin_api_client.post("/api/v1/tiers", {"name": "budget", "rules": rules}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["rules"] == rules
    assert admin_api_client.get("/api/v1/tiers/budget").json()["rules"] == rules


@pytest.mark.parametrize(
    "change, field, reason",
    [
        ({"timezone": "Mars/Olympus"}, "timezone", "unknown time zone"),
        ({"timezone": 7}, "timezone", ""),
        ({"limit": -1}, "limit", ""),
        ({"period": "fortnight"}, "period", ""),
        ({"mode": "lenient"}, "mode", ""),
    ],
)
def test_a_bad_quota_is_a_400_naming_its_field_and_nothing_is_saved(api, admin_api_client, change, field, reason):
    from policies.models import Tier

    rule = {"type": "quota", "limit": 1000, "period": "day", **change}
    response = admin_api_client.post("/api/v1/tiers", {"name": "budget", "rules": {"team": [rule]}}, format="json")
    assert response.status_code == 400, response.content
    [(path, message)] = response.json()["error"]["fields"].items()
    assert path == f"rules.team.0.{field}" and reason in message, (path, message)
    assert not Tier.objects.filter(name="budget").exists()
