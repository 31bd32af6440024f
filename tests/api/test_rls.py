"""Envoy's rate limit requests mapped onto our levels (policies/services/rls.py): one decision per
request, the answer's statuses and header fields, and the refusals."""

import math

import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from prometheus_client import REGISTRY

from core import StoreUnavailable
from core.recorder import DecisionRecorder
from core.stores.redis import RedisStore
from policies.compile import PolicyCache, install_policy_cache
from policies.services.errors import Invalid
from policies.services.leases import TICKET_HEADER
from policies.services.rls import current_limit, should_rate_limit
from policies.telemetry import install_decision_recorder, reset_decision_recorder

Response = rls_pb2.RateLimitResponse
Unit = Response.RateLimit


def descriptor(*entries, hits=None):
    found = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        found.hits_addend.value = hits
    return found


def ask(*descriptors, domain="limiter", hits=0):
    return rls_pb2.RateLimitRequest(domain=domain, descriptors=descriptors, hits_addend=hits)


def decide(*descriptors, **kwargs):
    return should_rate_limit(ask(*descriptors, **kwargs)).response


def headers(response):
    return {h.key: h.value for h in response.response_headers_to_add}


def test_a_team_descriptor_is_allowed_with_its_limit_and_rate_limit_fields(api):
    response = decide(descriptor(("team", "acme")))
    assert response.overall_code == Response.OK
    [status] = response.statuses
    assert status.code == Response.OK
    # acme is pro: team token_bucket(1000, 100/s), stated as its rate.
    assert (status.current_limit.requests_per_unit, status.current_limit.unit) == (100, Unit.SECOND)
    assert status.current_limit.name == "team:token_bucket"
    assert status.limit_remaining == 999
    assert headers(response) == {
        "RateLimit-Policy": '"team:token_bucket";q=1000;w=10',
        "RateLimit": '"team:token_bucket";r=999',
    }


def test_over_the_limit_every_descriptor_is_answered_and_retry_after_is_added(memory_engine, load, policy_doc):
    policy_doc["tiers"]["free"]["team"] = [{"type": "fixed_window", "limit": 3, "window": 60}]
    load(policy_doc)
    answers = [decide(descriptor(("team", "t1"))) for _ in range(9)]
    assert [a.overall_code for a in answers] == [Response.OK] * 3 + [Response.OVER_LIMIT] * 6
    over = answers[3]
    [status] = over.statuses
    assert status.code == Response.OVER_LIMIT
    assert (status.current_limit.requests_per_unit, status.current_limit.unit) == (3, Unit.MINUTE)
    assert status.limit_remaining == 0
    assert 0 < status.duration_until_reset.ToNanoseconds() <= 60e9
    fields = headers(over)
    assert fields["Retry-After"] == str(math.ceil(status.duration_until_reset.ToNanoseconds() / 1e9))
    assert fields["RateLimit"].startswith('"team:fixed_window";r=0;t=')


def test_the_descriptors_of_a_request_are_one_decision_that_takes_nothing_when_denied(memory_engine, load, policy_doc):
    policy_doc["tiers"]["free"]["user"] = [{"type": "fixed_window", "limit": 5, "window": 60}]
    policy_doc["tiers"]["free"]["team"] = [{"type": "fixed_window", "limit": 2, "window": 60}]
    load(policy_doc)
    both = (descriptor(("team", "t1")), descriptor(("user", "u1")))
    assert [decide(*both).overall_code for _ in range(3)] == [Response.OK, Response.OK, Response.OVER_LIMIT]
    denied = decide(*both)
    # The team blocked; the user's descriptor is answered OK, and nothing was taken from it.
    assert [s.code for s in denied.statuses] == [Response.OVER_LIMIT, Response.OK]
    assert [decide(descriptor(("user", "u1"))).overall_code for _ in range(4)] == [
        Response.OK,
        Response.OK,
        Response.OK,
        Response.OVER_LIMIT,
    ]


def test_grpc_and_rest_decisions_share_the_buckets(memory_engine, load, policy_doc, decide_client):
    policy_doc["tiers"]["free"]["team"] = [{"type": "fixed_window", "limit": 4, "window": 60}]
    load(policy_doc)
    assert decide(descriptor(("team", "t1")), hits=3).overall_code == Response.OK
    rest = decide_client.post("/api/v1/decisions", {"keys": {"team": "t1"}}, format="json")
    assert rest.json()["allowed"] is True and rest.json()["remaining"] == 0
    assert decide(descriptor(("team", "t1"))).overall_code == Response.OVER_LIMIT


def test_the_cost_is_the_descriptors_hits_addend_else_the_requests(memory_engine, load, policy_doc):
    policy_doc["tiers"]["free"]["team"] = [{"type": "fixed_window", "limit": 10, "window": 60}]
    load(policy_doc)
    assert decide(descriptor(("team", "t1")), hits=4).statuses[0].limit_remaining == 6
    assert decide(descriptor(("team", "t1"), hits=5), hits=4).statuses[0].limit_remaining == 1
    assert decide(descriptor(("team", "t1"))).statuses[0].limit_remaining == 0  # unset: 1


def test_a_hits_addend_of_zero_checks_without_taking(memory_engine, load, policy_doc):
    policy_doc["tiers"]["free"]["team"] = [{"type": "fixed_window", "limit": 1, "window": 60}]
    load(policy_doc)
    for _ in range(3):
        assert decide(descriptor(("team", "t1"), hits=0)).overall_code == Response.OK
    assert decide(descriptor(("team", "t1"))).overall_code == Response.OK
    assert decide(descriptor(("team", "t1"), hits=0)).overall_code == Response.OVER_LIMIT


def test_a_checked_descriptor_that_is_over_stops_the_others_from_taking(memory_engine, load, policy_doc):
    policy_doc["tiers"]["free"]["user"] = [{"type": "fixed_window", "limit": 5, "window": 60}]
    policy_doc["tiers"]["free"]["team"] = [{"type": "fixed_window", "limit": 1, "window": 60}]
    load(policy_doc)
    decide(descriptor(("team", "t1")))
    denied = decide(descriptor(("team", "t1"), hits=0), descriptor(("user", "u1"), hits=1))
    assert [s.code for s in denied.statuses] == [Response.OVER_LIMIT, Response.OK]
    assert decide(descriptor(("user", "u1"))).statuses[0].limit_remaining == 4  # nothing taken before


def test_a_priority_entry_keeps_its_watermark(api, load, policy_doc):
    policy_doc["tiers"]["free"]["team"] = [{"type": "fixed_window", "limit": 10, "window": 60}]
    policy_doc["priorities"]["batch"] = {"watermark": 0.5, "levels": ["team"]}
    load(policy_doc)
    batch = [decide(descriptor(("team", "t1"), ("priority", "batch"))).overall_code for _ in range(6)]
    assert batch == [Response.OK] * 5 + [Response.OVER_LIMIT]
    assert decide(descriptor(("team", "t1"), ("priority", "interactive"))).overall_code == Response.OK


def test_a_slot_taken_hands_its_lease_to_the_upstream(memory_engine, load, policy_doc, decide_client):
    policy_doc["tiers"]["free"]["team"] = [{"type": "concurrency", "limit": 1, "lease": 30}]
    load(policy_doc)
    first = decide(descriptor(("team", "t1")))
    [lease] = [h.value for h in first.request_headers_to_add if h.key == TICKET_HEADER]
    assert lease
    second = decide(descriptor(("team", "t1")))
    assert second.overall_code == Response.OVER_LIMIT and not second.request_headers_to_add
    assert not first.statuses[0].HasField("current_limit")  # a concurrency limit has no unit
    # The REST lease: released through the API, the slot is free again, once.
    assert decide_client.post(f"/api/v1/leases/{lease}/release").status_code == 200
    assert decide(descriptor(("team", "t1"))).overall_code == Response.OK
    assert decide_client.post(f"/api/v1/leases/{lease}/release").status_code == 404


def test_a_lease_descriptor_gives_the_slot_back_as_envoy_asks_at_the_streams_end(memory_engine, load, policy_doc):
    policy_doc["tiers"]["free"]["team"] = [{"type": "concurrency", "limit": 1, "lease": 30}]
    load(policy_doc)
    first = decide(descriptor(("team", "t1")))
    [lease] = [h.value for h in first.request_headers_to_add if h.key == TICKET_HEADER]
    assert decide(descriptor(("team", "t1"))).overall_code == Response.OVER_LIMIT
    released = decide(descriptor(("lease", lease)))
    assert released.overall_code == Response.OK and [s.code for s in released.statuses] == [Response.OK]
    assert not released.request_headers_to_add and not released.response_headers_to_add
    assert decide(descriptor(("team", "t1"))).overall_code == Response.OK
    # Given back already, or never a ticket: answered OK, and nothing more is released.
    again = decide(descriptor(("lease", lease)), descriptor(("lease", "not-a-ticket")))
    assert [s.code for s in again.statuses] == [Response.OK, Response.OK]
    assert decide(descriptor(("team", "t1"))).overall_code == Response.OVER_LIMIT


def test_every_decision_is_recorded_for_the_statistics_and_the_what_if(api, clock):
    recorder = DecisionRecorder(clock=clock, flush_every=None)
    install_decision_recorder(recorder)
    try:
        decide(descriptor(("team", "acme"), ("user", "u1"), ("priority", "batch")), hits=3)
    finally:
        reset_decision_recorder()
    [kept] = recorder.records(0, 2**40)
    assert (kept.keys, kept.cost, kept.priority, kept.allowed) == ({"team": "acme", "user": "u1"}, 3, "batch", True)


def test_a_store_that_is_down_gets_the_levels_fail_modes(db, load, policy_doc, unreachable_redis_url):
    policy_doc["levels"][1]["fail_mode"] = "closed"
    store = RedisStore(url=unreachable_redis_url)
    install_policy_cache(PolicyCache(store=store))
    try:
        load(policy_doc)
        open_user = decide(descriptor(("user", "u1")))
        closed_team = decide(descriptor(("team", "acme")))
    finally:
        install_policy_cache(None)
        store.close()
    assert open_user.overall_code == Response.OK
    assert closed_team.overall_code == Response.OVER_LIMIT
    assert headers(closed_team)["Retry-After"] == "1"


def test_a_check_only_descriptor_with_the_store_down_cannot_be_answered(db, load, policy_doc, unreachable_redis_url):
    """As a REST dry run (503): a check reads the store, and no fail mode reads for it. The
    gRPC service answers UNAVAILABLE, and Envoy then does what failure_mode_deny says."""
    store = RedisStore(url=unreachable_redis_url)
    install_policy_cache(PolicyCache(store=store))
    try:
        load(policy_doc)
        with pytest.raises(StoreUnavailable):
            decide(descriptor(("user", "u1"), hits=0))
    finally:
        install_policy_cache(None)
        store.close()


@pytest.mark.parametrize(
    "request_, field, words",
    [
        (ask(descriptor(("team", "acme")), domain="other"), "domain", "must be 'limiter'"),
        (ask(), "descriptors", "at least one descriptor"),
        (ask(descriptor(("tenant", "acme"))), "descriptors[0].entries[0].key", "unknown level 'tenant'"),
        (ask(descriptor(("team", "acme"), ("priority", "vip"))), "descriptors[0].entries[1].value", "'vip'"),
        (ask(descriptor(("team", ""))), "descriptors[0].entries[0].value", "non-empty"),
        (ask(descriptor(("team", "x" * 257))), "descriptors[0].entries[0].value", "at most 256"),
        (ask(descriptor(("priority", "batch"))), "descriptors[0].entries", "at least one level"),
        (ask(descriptor(("team", "a")), descriptor(("team", "b"))), "descriptors[1].entries[0].value", "one key"),
        (ask(descriptor(("team", "a"), hits=1), descriptor(("user", "u"), hits=2)), "descriptors", "costs [1, 2]"),
        (ask(descriptor(("team", "a"), hits=10**16)), "descriptors[0].hits_addend", "whole number from 0"),
        (ask(descriptor(("team", "a"), ("lease", "t"))), "descriptors[0].entries", "one 'lease' entry"),
        (ask(descriptor(("lease", "t")), descriptor(("team", "a"))), "descriptors[1].entries", "apart from any"),
        (ask(descriptor(("lease", ""))), "descriptors[0].entries[0].value", "a lease ticket of 1 to 2048"),
        (ask(descriptor(("lease", "t")), domain="other"), "domain", "must be 'limiter'"),
    ],
)
def test_a_request_that_is_not_one_decision_is_refused_naming_what_is_wrong(api, request_, field, words):
    with pytest.raises(Invalid) as refused:
        should_rate_limit(request_)
    assert field in refused.value.fields and words in refused.value.message


@pytest.mark.parametrize(
    "quota, window, expected",
    [
        (600, 60, (600, Unit.MINUTE)),
        (1000, 10, (100, Unit.SECOND)),
        (5, 3600, (5, Unit.HOUR)),
        (10, 86400 * 7, (10, Unit.WEEK)),
        (1, 7200, (12, Unit.DAY)),
        (3, 7, (259200, Unit.WEEK)),
        (1, 11, None),  # 1 per 11 s is no whole number in any unit up to a year
        (5, None, None),
    ],
)
def test_a_rules_quota_is_stated_in_envoys_units_where_it_can_be(quota, window, expected):
    limit = current_limit("item", quota, window)
    assert (limit and (limit.requests_per_unit, limit.unit)) == expected


# POST /api/v1/rls/json: envoyproxy/ratelimit's JSON contract, on the gateways' request path.


def post_json(client, body):
    return client.post("/api/v1/rls/json", body, format="json")


def test_json_answers_200_under_the_limit_and_429_over_in_protojson(memory_engine, load, policy_doc, decide_client):
    policy_doc["tiers"]["free"]["team"] = [{"type": "fixed_window", "limit": 2, "window": 60}]
    load(policy_doc)
    body = {"domain": "limiter", "descriptors": [{"entries": [{"key": "team", "value": "t1"}]}]}
    answers = [post_json(decide_client, body) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[0].json() == {
        "overallCode": "OK",
        "statuses": [
            {
                "code": "OK",
                "currentLimit": {"name": "team:fixed_window", "requestsPerUnit": 2, "unit": "MINUTE"},
                "limitRemaining": 1,
            }
        ],
        "responseHeadersToAdd": [
            {"key": "RateLimit-Policy", "value": '"team:fixed_window";q=2;w=60'},
            {"key": "RateLimit", "value": '"team:fixed_window";r=1'},
        ],
    }
    over = answers[2]
    assert over.json()["overallCode"] == "OVER_LIMIT"
    [status] = over.json()["statuses"]
    assert status["code"] == "OVER_LIMIT" and status["durationUntilReset"].endswith("s")
    # The answer's header fields are the response's too.
    assert over["Retry-After"] == str(math.ceil(float(status["durationUntilReset"][:-1])))
    assert over["RateLimit"].startswith('"team:fixed_window";r=0;t=')


def test_json_gives_a_slot_back_for_a_lease_descriptor(memory_engine, load, policy_doc, decide_client):
    policy_doc["tiers"]["free"]["team"] = [{"type": "concurrency", "limit": 1, "lease": 30}]
    load(policy_doc)
    body = {"domain": "limiter", "descriptors": [{"entries": [{"key": "team", "value": "t1"}]}]}
    taken = post_json(decide_client, body).json()
    [lease] = [h["value"] for h in taken["requestHeadersToAdd"] if h["key"] == TICKET_HEADER]
    assert post_json(decide_client, body).status_code == 429
    release = {"domain": "limiter", "descriptors": [{"entries": [{"key": "lease", "value": lease}]}]}
    released = post_json(decide_client, release)
    assert (released.status_code, released.json()) == (200, {"overallCode": "OK", "statuses": [{"code": "OK"}]})
    assert post_json(decide_client, body).status_code == 200


def test_json_takes_snake_case_names_and_hits_addend_as_the_cost(memory_engine, load, policy_doc, decide_client):
    policy_doc["tiers"]["free"]["team"] = [{"type": "fixed_window", "limit": 10, "window": 60}]
    load(policy_doc)
    body = {"domain": "limiter", "descriptors": [{"entries": [{"key": "team", "value": "t1"}], "hits_addend": 4}]}
    assert post_json(decide_client, body).json()["statuses"][0]["limitRemaining"] == 6
    body = {"domain": "limiter", "hitsAddend": 5, "descriptors": [{"entries": [{"key": "team", "value": "t1"}]}]}
    assert post_json(decide_client, body).json()["statuses"][0]["limitRemaining"] == 1


@pytest.mark.parametrize(
    "body, field, words",
    [
        ([], "body", "must be a JSON object"),
        ({"domain": "limiter", "descriptors": [], "extra": 1}, "body", 'no field named "extra"'),
        ({"domain": "limiter", "hitsAddend": -1}, "body", "hitsAddend"),
        ({"domain": 5}, "body", "domain"),
        ({"domain": "other", "descriptors": [{"entries": [{"key": "team", "value": "a"}]}]}, "domain", "'other'"),
        ({"domain": "limiter"}, "descriptors", "at least one descriptor"),
        (
            {"domain": "limiter", "descriptors": [{"entries": [{"key": "x", "value": "a"}]}]},
            "descriptors[0].entries[0].key",
            "unknown level",
        ),
    ],
)
def test_json_that_is_not_one_decision_is_a_400_naming_what_is_wrong(api, decide_client, body, field, words):
    response = post_json(decide_client, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid" and field in error["fields"] and words in error["message"]


def test_json_that_does_not_parse_is_a_400(api, decide_client):
    response = decide_client.post("/api/v1/rls/json", b"{nope", content_type="application/json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "malformed_request"


def test_json_needs_a_deciding_token(api, client):
    response = client.post("/api/v1/rls/json", {"domain": "limiter"}, content_type="application/json")
    assert response.status_code == 401


def test_json_decisions_are_timed_as_rls_json(api, decide_client):
    def timed():
        return REGISTRY.get_sample_value("limiter_decision_seconds_count", {"endpoint": "rls_json"}) or 0

    before = timed()
    post_json(decide_client, {"domain": "limiter", "descriptors": [{"entries": [{"key": "team", "value": "acme"}]}]})
    assert timed() == before + 1
