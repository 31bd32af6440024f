"""The `limit` decorator, and what its three faces share (policies/embedding.py): inline
limits and the console's, sync and async views, keys, costs, answers, request.limit, the
record, and a console edit reaching a decorated view within a second.

The views below are this module's own URLconf (`pytest.mark.urls`). Inline rules read
ViewLimit.timer, the console's limiters the policy cache's clock: both are manual clocks,
so no test sleeps. Async views are called through Django's AsyncClient (the ASGI handler).
"""

import time

import pytest
from asgiref.sync import async_to_sync
from django.http import HttpResponse, JsonResponse
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from core import Decision, ManualClock
from core.recorder import DecisionRecorder
from core.stats import DenialStats
from core.stores.redis import RedisStore
from policies.compile import PolicyCache, install_policy_cache
from policies.embedding import ViewLimit, client_ip, limit, reset_limits
from policies.metrics import EMBEDDED_DECISIONS
from policies.middleware import LimiterMiddleware
from policies.models import Rule, Tier
from policies.stores import limiter_store
from policies.telemetry import install_decision_recorder, install_denial_stats, reset_decision_recorder
from policies.throttling import LimiterThrottle

seen = []  # the decisions the views saw in request.limit


def by_user(request):
    return request.GET.get("user") or None


def by_team(request):
    return request.headers.get("X-Team")


async def async_by_user(request):
    return request.GET.get("user") or None


def cost_from_query(request):
    return float(request.GET.get("cost", "1"))


def answer(request):
    seen.append(getattr(request, "limit", None))
    return JsonResponse({"ok": True})


async def async_answer(request):
    seen.append(getattr(request, "limit", None))
    return JsonResponse({"ok": True})


def slow_down(request):
    return HttpResponse(f"slow down, retry in {request.limit.retry_after:g} s", status=429)


@limit(rate="3/s")
def inline(request):
    return answer(request)


@limit(rate="3/s")
async def inline_async(request):
    return await async_answer(request)


@limit(rate="3/s")
def other_inline(request):
    return answer(request)


@limit(rate="2/min", scope="shared")
def shared_a(request):
    return answer(request)


@limit(rate="2/min", scope="shared")
def shared_b(request):
    return answer(request)


@limit(tier="small", key=by_user)
def small(request):
    return answer(request)


@limit(tier="small", key=async_by_user)
async def small_async(request):
    return await async_answer(request)


@limit(team=by_team, key=by_user)
def tenant(request):
    return answer(request)


@limit(rate="10/s", cost=cost_from_query)
def costly(request):
    return answer(request)


@limit(rate="1/min", denied_view=slow_down)
def with_denied_view(request):
    return answer(request)


@limit(rules=[{"type": "concurrency", "limit": 1, "lease": 600}])
def one_at_a_time(request):
    seen.append(request.limit.lease)
    return answer(request)


@limit(rate="1/min", key=lambda request: None if request.GET.get("free") else "someone")
def exemptable(request):
    return answer(request)


@method_decorator(limit(rate="2/min"), name="get")
class ClassView(View):
    def get(self, request):
        return answer(request)


@method_decorator(limit(rate="2/min"), name="get")
class AsyncClassView(View):
    async def get(self, request):
        return await async_answer(request)


class ThrottledView(APIView):
    authentication_classes = []
    permission_classes = [AllowAny]
    throttle_classes = [LimiterThrottle]

    def get(self, request):
        seen.append(request.limit)
        return Response({"ok": True})


urlpatterns = [
    path("throttled/", ThrottledView.as_view()),
    path("inline/", inline),
    path("inline-async/", inline_async),
    path("other-inline/", other_inline),
    path("shared-a/", shared_a),
    path("shared-b/", shared_b),
    path("small/", small),
    path("small-async/", small_async),
    path("tenant/", tenant),
    path("costly/", costly),
    path("denied-view/", with_denied_view),
    path("one-at-a-time/", one_at_a_time),
    path("exemptable/", exemptable),
    path("class/", ClassView.as_view()),
    path("async-class/", AsyncClassView.as_view()),
]

pytestmark = pytest.mark.urls(__name__)

SMALL = 2  # what the tier "small" lets a user take, ever (a bucket that never refills)
POLICY = {
    "default_tier": "free",
    "levels": [{"name": "user"}, {"name": "team"}, {"name": "global"}],
    "tiers": {
        "free": {"user": [{"type": "token_bucket", "capacity": 1, "per_second": 0}]},
        "small": {"user": [{"type": "token_bucket", "capacity": SMALL, "per_second": 0, "label": "SMALL"}]},
        "big": {"team": [{"type": "token_bucket", "capacity": 4, "per_second": 0}]},
    },
    "tenants": {"acme": {"tier": "big"}},
}


@pytest.fixture
def inline_clock(monkeypatch):
    clock = ManualClock()
    monkeypatch.setattr(ViewLimit, "timer", clock)
    return clock


@pytest.fixture(autouse=True)
def fresh(inline_clock):
    """A fresh store for this process (in memory here), limits compiled anew."""
    seen.clear()
    limiter_store.cache_clear()
    reset_limits()
    yield
    reset_limits()


@pytest.fixture
def console(db, load, clock, store):
    """The policy above, loaded, and the process's policy cache on a store and clock of the
    test's own; statistics and a decision record in process."""
    load(POLICY)
    cache = PolicyCache(store=store, clock=clock, limiter_clock=clock)
    install_policy_cache(cache)
    stats = DenialStats(clock=clock, flush_every=None)
    install_denial_stats(stats)
    recorder = DecisionRecorder(clock=clock, flush_every=None)
    install_decision_recorder(recorder)
    yield cache, stats, recorder
    install_policy_cache(None)
    install_denial_stats(None)
    reset_decision_recorder()


def get(client, url, **extra):
    return client.get(url, REMOTE_ADDR=extra.pop("address", "10.0.0.1"), **extra)


def aget(async_client, url, **extra):
    return async_to_sync(async_client.get)(url, REMOTE_ADDR=extra.pop("address", "10.0.0.1"), **extra)


# --- inline limits -----------------------------------------------------------------------------


def test_a_decorated_sync_view_lets_the_limit_through_then_answers_429_in_the_api_shape(client):
    answers = [get(client, "/inline/") for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert [a["RateLimit"] for a in answers[:3]] == ['"default";r=2', '"default";r=1', '"default";r=0']
    denied = answers[3]
    assert denied.json() == {
        "error": {"code": "rate_limited", "message": "Too many requests; try again in 1 second.", "fields": {}}
    }
    assert (denied["Retry-After"], denied["RateLimit"]) == ("1", '"default";r=0;t=1')
    assert denied["RateLimit-Policy"] == '"default";q=3;w=1'
    assert len(seen) == 3 and all(isinstance(d, Decision) and d.allowed for d in seen)


def test_a_decorated_async_view_is_limited_alike(async_client, inline_clock):
    answers = [aget(async_client, "/inline-async/") for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert answers[3]["Retry-After"] == "1"
    assert answers[0]["RateLimit"] == '"default";r=2'
    assert [round(d.remaining) for d in seen] == [2, 1, 0]
    inline_clock.advance(1 / 3)
    assert aget(async_client, "/inline-async/").status_code == 200


def test_each_view_and_each_client_has_buckets_of_its_own_unless_they_share_a_scope(client):
    for _ in range(3):
        get(client, "/inline/")
    assert get(client, "/inline/").status_code == 429
    assert get(client, "/other-inline/").status_code == 200  # another view
    assert get(client, "/inline/", address="10.0.0.2").status_code == 200  # another client
    assert [get(client, url).status_code for url in ("/shared-a/", "/shared-b/", "/shared-a/")] == [200, 200, 429]


def test_a_class_views_handler_is_limited_through_method_decorator(client, async_client):
    assert [get(client, "/class/").status_code for _ in range(3)] == [200, 200, 429]
    assert [aget(async_client, "/async-class/").status_code for _ in range(3)] == [200, 200, 429]


def test_a_cost_callable_takes_what_the_request_says(client):
    assert get(client, "/costly/", QUERY_STRING="cost=7")["RateLimit"] == '"default";r=3'
    denied = get(client, "/costly/", QUERY_STRING="cost=4")
    assert denied.status_code == 429
    assert get(client, "/costly/", QUERY_STRING="cost=3").status_code == 200


@pytest.mark.parametrize("cost", ["-1", "0", "nan", "1e300"])
def test_a_cost_the_engine_refuses_is_a_400_naming_it_never_a_500(client, cost):
    refused = get(client, "/costly/", QUERY_STRING=f"cost={cost}")
    assert refused.status_code == 400
    body = refused.json()["error"]
    assert body["code"] == "invalid" and list(body["fields"]) == ["cost"]
    assert seen == []


def test_a_key_that_is_too_long_is_a_400(client, settings):
    settings.LIMITER_IP_HEADER = "X-Forwarded-For"
    refused = get(client, "/inline/", HTTP_X_FORWARDED_FOR="9" * 300)
    assert refused.status_code == 400 and list(refused.json()["error"]["fields"]) == ["key"]


def test_a_denied_view_answers_a_denial_with_the_decision_and_the_fields(client):
    assert get(client, "/denied-view/").status_code == 200
    denied = get(client, "/denied-view/")
    assert denied.status_code == 429
    assert denied.content == b"slow down, retry in 60 s"
    assert denied["Retry-After"] == "60" and denied["RateLimit"] == '"default";r=0;t=60'


def test_a_concurrency_slot_is_released_when_the_view_returns(client):
    first, second = get(client, "/one-at-a-time/"), get(client, "/one-at-a-time/")
    assert first.status_code == second.status_code == 200
    assert seen[0] and seen[2] and seen[0] != seen[2]  # each held the one slot, in turn


def test_a_key_function_answering_none_exempts_the_request(client):
    assert [get(client, "/exemptable/", QUERY_STRING="free=1").status_code for _ in range(3)] == [200] * 3
    assert "RateLimit" not in get(client, "/exemptable/", QUERY_STRING="free=1")
    assert seen[0] is None
    assert [get(client, "/exemptable/").status_code for _ in range(2)] == [200, 429]


@pytest.mark.parametrize(
    "header, proxies, forwarded, expected",
    [
        (None, 1, "6.6.6.6", "10.0.0.1"),  # no header setting: the header is not believed
        ("X-Forwarded-For", 1, "6.6.6.6, 7.7.7.7", "7.7.7.7"),  # what our one proxy saw
        ("X-Forwarded-For", 2, "6.6.6.6, 7.7.7.7", "6.6.6.6"),
        ("X-Forwarded-For", 2, "7.7.7.7", "10.0.0.1"),  # not through both: REMOTE_ADDR
    ],
)
def test_the_client_address_behind_proxies_follows_the_settings(rf, settings, header, proxies, forwarded, expected):
    settings.LIMITER_IP_HEADER, settings.LIMITER_IP_PROXIES = header, proxies
    request = rf.get("/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=forwarded)
    assert client_ip(request) == expected


@pytest.mark.parametrize(
    "arguments, named",
    [
        ({"rate": "10/fortnight"}, "rate="),
        ({"rate": "1/s", "tier": "pro"}, "not both"),
        ({"tier": "pro", "burst": 3}, "burst="),
        ({"rules": [{"type": "nope"}]}, "rules=[0].type: unknown rule type"),
        ({"rate": "1/s", "key": "no.such.function"}, "key=: cannot import"),
        ({"rate": "1/s", "cost": -2}, "cost="),
        ({"tier": ""}, "tier="),
        ({}, "give either"),
    ],
)
def test_bad_arguments_fail_when_the_view_is_decorated_naming_them(arguments, named):
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured) as raised:
        limit(**arguments)(answer)
    assert named in str(raised.value) and "tests.policies.test_embedding.answer" in str(raised.value)


# --- the console's policies ------------------------------------------------------------------


def test_a_tier_named_by_the_decorator_limits_each_user_by_its_rules(client, console):
    _, stats, recorder = console
    answers = [get(client, "/small/", QUERY_STRING="user=ann") for _ in range(SMALL + 1)]
    assert [a.status_code for a in answers] == [200] * SMALL + [429]
    denied = answers[-1]
    assert denied.json()["error"]["code"] == "rate_limited"
    assert denied["RateLimit-Policy"] == '"user:token_bucket";q=2'  # the API's own fields
    assert "Retry-After" not in denied  # a bucket that never refills: no time to give
    assert get(client, "/small/", QUERY_STRING="user=bob").status_code == 200
    # Recorded as the decision API's are, and marked as embedded.
    records = recorder.records(0, 2e9)
    assert records[SMALL].blocked_by == "user: token_bucket(2, 0/s)"
    assert [r.via for r in records] == ["embedded"] * (SMALL + 2)
    assert [r.keys for r in records][0] == {"user": "ann", "global": "*"}
    assert [r.allowed for r in records] == [True] * SMALL + [False, True]


def test_an_async_view_under_a_tier_decides_and_records_alike(async_client, console):
    answers = [aget(async_client, "/small-async/", QUERY_STRING="user=ann") for _ in range(SMALL + 1)]
    assert [a.status_code for a in answers] == [200] * SMALL + [429]
    assert seen[-1].remaining == 0


def test_the_team_a_key_function_names_picks_its_tenants_rules(client, console):
    _, stats, _ = console
    before = EMBEDDED_DECISIONS.labels("decorator", "denied")._value.get()
    acme = [get(client, "/tenant/", QUERY_STRING=f"user=u{i}", HTTP_X_TEAM="acme").status_code for i in range(5)]
    assert acme == [200] * 4 + [429]  # the tier "big": 4 for the team, whoever the user
    assert [d.remaining for d in seen] == [3, 2, 1, 0]
    # An unknown team gets the default tier: 1 per user.
    assert [get(client, "/tenant/", QUERY_STRING="user=x", HTTP_X_TEAM="newco").status_code for _ in "ab"] == [
        200,
        429,
    ]
    assert stats.denials(["acme", "newco"], 3600) == {"acme": (5, 1), "newco": (2, 1)}
    assert EMBEDDED_DECISIONS.labels("decorator", "denied")._value.get() == before + 2
    # The statistics mark them as embedded, apart from the API's decisions.
    report = stats.report(3600)
    assert (report["decisions"], report["embedded"], report["embedded_denied"]) == (7, 7, 2)


def test_a_console_edit_of_the_tier_reaches_the_decorated_view_within_a_second(client, console, clock, commits):
    """The operator raises the tier "small" from 2 to 5 requests a user; within the policy
    cache's check interval the view keeps the old rule, and within a second the new one."""
    for _ in range(SMALL):
        get(client, "/small/", QUERY_STRING="user=ann")
    assert get(client, "/small/", QUERY_STRING="user=ann").status_code == 429
    with commits():
        rule = Rule.objects.get(tier__name="small")
        rule.params = {**rule.params, "capacity": 5}
        rule.save()
    clock.advance(0.2)
    assert get(client, "/small/", QUERY_STRING="user=ann").status_code == 429  # not checked yet
    clock.advance(0.8)  # a second since the edit: the version has been checked
    answers = [get(client, "/small/", QUERY_STRING="user=ann").status_code for _ in range(6)]
    assert answers == [200] * 5 + [429]


def test_a_tier_deleted_since_falls_back_to_the_default_tier(client, console, clock, commits):
    with commits():
        Rule.objects.filter(tier__name="small").delete()
        Tier.objects.filter(name="small").delete()
    clock.advance(1.0)
    answers = [get(client, "/small/", QUERY_STRING="user=ann") for _ in "ab"]
    assert [a.status_code for a in answers] == [200, 429]
    assert answers[1]["RateLimit-Policy"] == '"user:token_bucket";q=1'  # the free tier's


def test_the_drf_throttle_takes_a_tier_from_the_console(client, console, settings):
    settings.LIMITER_THROTTLE = {"tier": "small", "key": "tests.policies.test_embedding.by_user"}
    answers = [get(client, "/throttled/", QUERY_STRING="user=ann") for _ in range(SMALL + 1)]
    assert [a.status_code for a in answers] == [200] * SMALL + [429]
    assert answers[-1].json()["error"]["code"] == "rate_limited"
    assert answers[0]["RateLimit-Policy"] == '"user:token_bucket";q=2'
    assert [d.remaining for d in seen] == [1, 0]  # request.limit, in the DRF view


def test_the_middleware_limits_in_an_async_chain_too(async_client, settings, monkeypatch, inline_clock):
    monkeypatch.setattr(LimiterMiddleware, "timer", inline_clock)
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "policies.middleware.LimiterMiddleware"]
    settings.LIMITER_MIDDLEWARE = {"paths": ["/inline-async/"], "rate": "2/min", "policy": "paths"}
    answers = [aget(async_client, "/inline-async/") for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    # Both limits' fields on an answer that went through both; the denial never reached the view.
    assert answers[0]["RateLimit-Policy"] == '"default";q=3;w=1, "paths";q=2;w=60'
    assert answers[2]["Retry-After"] == "30" and len(seen) == 2


@pytest.mark.parametrize("fail_mode, status", [("open", 200), ("closed", 429)])
def test_with_redis_down_a_tier_follows_its_levels_fail_mode_within_the_timeout(
    client, async_client, db, load, clock, unreachable_redis_url, fail_mode, status
):
    load({**POLICY, "levels": [{"name": "user", "fail_mode": fail_mode}, {"name": "team"}, {"name": "global"}]})
    store = RedisStore(url=unreachable_redis_url, timeout=0.05)
    install_policy_cache(PolicyCache(store=store, clock=clock))
    try:
        started = time.monotonic()
        answers = [get(client, "/small/", QUERY_STRING="user=ann") for _ in range(5)]
        answers += [aget(async_client, "/small-async/", QUERY_STRING="user=ann") for _ in range(5)]
        elapsed = time.monotonic() - started
    finally:
        install_policy_cache(None)
        store.close()
    assert [a.status_code for a in answers] == [status] * 10
    assert elapsed < 2.0, f"10 requests on a dead Redis took {elapsed:.2f} s"
    if status == 200:
        assert all(d.degraded and d.allowed for d in seen)
    else:
        assert {a["Retry-After"] for a in answers} == {"1"}
        assert all(a.json()["error"]["code"] == "rate_limited" for a in answers)
