"""The embedded limiter in front of Django views: the DRF throttle, the middleware, and the
RateLimit header fields they share (policies/headers.py).

The views below are this module's own URLconf (`pytest.mark.urls`); the clock is a
ManualClock put in the classes' `timer`, so no test sleeps.
"""

import math

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import JsonResponse
from django.urls import path
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from core import Decision, ManualClock
from core.decision import COST_EXCEEDS_LIMIT
from policies.headers import advertised_policy, ratelimit_headers, retry_after_header
from policies.middleware import LimiterMiddleware
from policies.stores import limiter_store
from policies.throttling import LimiterThrottle, build_limit, reset_limits

calls = []  # what reached the views


class ThrottledView(APIView):
    authentication_classes = [SessionAuthentication]
    permission_classes = [AllowAny]
    throttle_classes = [LimiterThrottle]

    def get(self, request):
        calls.append("throttled")
        return Response({"ok": True})


class UploadThrottle(LimiterThrottle):
    setting = "LIMITER_UPLOAD_THROTTLE"


class DoublyThrottledView(ThrottledView):
    throttle_classes = [LimiterThrottle, UploadThrottle]


def plain_view(request):
    calls.append(request.path)
    return JsonResponse({"ok": True})


urlpatterns = [
    path("throttled/", ThrottledView.as_view()),
    path("doubly-throttled/", DoublyThrottledView.as_view()),
    path("export/report", plain_view),
    path("public/page", plain_view),
]

pytestmark = pytest.mark.urls(__name__)

MIDDLEWARE_PATH = "policies.middleware.LimiterMiddleware"


@pytest.fixture
def clock():
    """Seconds from 0, as the in-process store's default clock (time.monotonic) counts."""
    return ManualClock()


@pytest.fixture(autouse=True)
def fresh(clock, monkeypatch):
    """Fresh buckets (the process's store, in memory here, made anew), and the manual clock
    in both classes."""
    calls.clear()
    limiter_store.cache_clear()
    reset_limits()
    monkeypatch.setattr(LimiterThrottle, "timer", clock)
    monkeypatch.setattr(LimiterMiddleware, "timer", clock)
    yield
    reset_limits()


@pytest.fixture
def throttle(settings):
    settings.LIMITER_THROTTLE = {"rate": "3/s"}


@pytest.fixture
def middleware(settings):
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE_PATH]
    settings.LIMITER_MIDDLEWARE = {"paths": ["/export/"], "rate": "2/min"}


def get(client, url, address="10.0.0.1"):
    return client.get(url, REMOTE_ADDR=address)


# The DRF throttle ------------------------------------------------------------------------


def test_requests_within_the_burst_go_through_and_say_what_is_left(client, throttle):
    answers = [get(client, "/throttled/") for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a["RateLimit"] for a in answers] == ['"default";r=2', '"default";r=1', '"default";r=0']
    assert all(a["RateLimit-Policy"] == '"default";q=3;w=1' for a in answers)
    assert "Retry-After" not in answers[0]
    assert calls == ["throttled"] * 3


def test_the_request_past_the_burst_is_a_429_in_the_api_error_shape(client, throttle):
    for _ in range(3):
        get(client, "/throttled/")
    denied = get(client, "/throttled/")
    assert denied.status_code == 429
    assert denied.json() == {
        "error": {"code": "rate_limited", "message": denied.json()["error"]["message"], "fields": {}}
    }
    assert denied["Retry-After"] == "1"  # a third of a second, rounded up
    assert denied["RateLimit-Policy"] == '"default";q=3;w=1'
    assert denied["RateLimit"] == '"default";r=0;t=1'
    assert calls == ["throttled"] * 3  # the view never saw the fourth


def test_once_the_clock_has_moved_on_the_client_is_allowed_again(client, throttle, clock):
    for _ in range(3):
        get(client, "/throttled/")
    assert get(client, "/throttled/").status_code == 429
    clock.advance(1 / 3)
    assert get(client, "/throttled/").status_code == 200
    assert get(client, "/throttled/").status_code == 429
    clock.advance(1.0)  # refills the whole burst, and no more
    assert [get(client, "/throttled/").status_code for _ in range(4)] == [200, 200, 200, 429]


def test_clients_at_different_addresses_have_buckets_of_their_own(client, throttle):
    for _ in range(3):
        get(client, "/throttled/", "10.0.0.1")
    assert get(client, "/throttled/", "10.0.0.1").status_code == 429
    other = get(client, "/throttled/", "10.0.0.2")
    assert other.status_code == 200
    assert other["RateLimit"] == '"default";r=2'


@pytest.mark.django_db
def test_a_logged_in_user_is_one_client_whatever_the_address(client, throttle, django_user_model):
    client.force_login(django_user_model.objects.create_user("ann"))
    for address in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        assert get(client, "/throttled/", address).status_code == 200
    assert get(client, "/throttled/", "10.0.0.4").status_code == 429
    client.logout()
    assert get(client, "/throttled/", "10.0.0.4").status_code == 200  # the address, anonymous


def test_retry_after_is_the_wait_in_whole_seconds_rounded_up(client, settings, clock):
    settings.LIMITER_THROTTLE = {"rate": "2/min"}
    get(client, "/throttled/")
    get(client, "/throttled/")
    assert get(client, "/throttled/")["Retry-After"] == "30"
    clock.advance(29.5)
    denied = get(client, "/throttled/")
    assert (denied["Retry-After"], denied["RateLimit"]) == ("1", '"default";r=0;t=1')
    assert denied["RateLimit-Policy"] == '"default";q=2;w=60'


def test_a_burst_above_the_rate_is_advertised_as_the_time_to_refill_it(client, settings):
    settings.LIMITER_THROTTLE = {"rate": "10/s", "burst": 25, "policy": "api"}
    answer = get(client, "/throttled/")
    assert answer["RateLimit-Policy"] == '"api";q=25;w=3'  # 2.5 s to refill, rounded up
    assert answer["RateLimit"] == '"api";r=24'


def test_rule_specs_take_the_place_of_a_rate(client, settings, clock):
    settings.LIMITER_THROTTLE = {"rules": [{"type": "sliding_window", "limit": 2, "window": 10}]}
    assert [get(client, "/throttled/").status_code for _ in range(3)] == [200, 200, 429]
    assert get(client, "/throttled/")["RateLimit-Policy"] == '"default";q=2;w=10'
    clock.advance(10)
    assert get(client, "/throttled/").status_code == 200


def test_the_advertised_quota_and_window_may_be_given(client, settings):
    settings.LIMITER_THROTTLE = {"rate": "100/hour", "quota": 100, "window": 3600}
    assert get(client, "/throttled/")["RateLimit-Policy"] == '"default";q=100;w=3600'


def test_changing_the_setting_starts_from_new_buckets(client, settings):
    settings.LIMITER_THROTTLE = {"rate": "1/min"}
    get(client, "/throttled/")
    assert get(client, "/throttled/").status_code == 429
    settings.LIMITER_THROTTLE = {"rate": "5/min"}
    assert get(client, "/throttled/")["RateLimit"] == '"default";r=4'


def test_a_key_function_that_answers_none_leaves_the_request_unlimited(client, settings):
    settings.LIMITER_THROTTLE = {"rate": "1/min", "key": lambda request: None}
    answers = [get(client, "/throttled/") for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert "RateLimit" not in answers[0]


def test_two_limiter_throttles_on_one_view_list_both_policies(client, settings):
    settings.LIMITER_THROTTLE = {"rate": "3/s"}
    settings.LIMITER_UPLOAD_THROTTLE = {"rate": "1/min", "policy": "uploads"}
    first, second = get(client, "/doubly-throttled/"), get(client, "/doubly-throttled/")
    assert first["RateLimit-Policy"] == '"default";q=3;w=1, "uploads";q=1;w=60'
    assert first["RateLimit"] == '"default";r=2, "uploads";r=0'
    assert second.status_code == 429
    assert second["RateLimit"] == '"default";r=1, "uploads";r=0;t=60'
    assert second["Retry-After"] == "60"


def test_without_its_setting_the_throttle_says_what_is_missing(client, settings):
    del settings.LIMITER_THROTTLE
    with pytest.raises(ImproperlyConfigured, match="LIMITER_THROTTLE"):
        get(client, "/throttled/")


@pytest.mark.parametrize(
    "config, named",
    [
        ({"rate": "10/fortnight"}, 'LIMITER_THROTTLE["rate"]'),
        ({"rate": "0/s"}, 'LIMITER_THROTTLE["rate"]'),
        ({"rate": "1/s", "burst": -1}, 'LIMITER_THROTTLE["burst"]'),
        ({"rate": "1/s", "rules": []}, "either"),
        ({"rate": "1/s", "paths": ["/x"]}, 'LIMITER_THROTTLE["paths"]: unknown field'),
        (
            {"rules": [{"type": "token_bucket", "capacity": 1, "per_second": 1}, {"type": "nope"}]},
            'LIMITER_THROTTLE["rules"][1].type: unknown rule type',
        ),
        ({"rate": "1/s", "key": "no.such.function"}, 'LIMITER_THROTTLE["key"]'),
        ({"rate": "1/s", "policy": "caf\u00e9"}, 'LIMITER_THROTTLE["policy"]'),
    ],
)
def test_a_bad_setting_is_refused_naming_the_field(config, named, clock):
    with pytest.raises(ImproperlyConfigured) as raised:
        build_limit(config, "LIMITER_THROTTLE", clock)
    assert named in str(raised.value)


# The middleware ---------------------------------------------------------------------------


def test_paths_outside_the_prefixes_pass_untouched(client, middleware):
    answers = [get(client, "/public/page") for _ in range(5)]
    assert [a.status_code for a in answers] == [200] * 5
    assert "RateLimit" not in answers[0] and "RateLimit-Policy" not in answers[0]


def test_a_protected_path_is_limited_per_client_with_headers_on_every_answer(client, middleware):
    first, second, denied = (get(client, "/export/report") for _ in range(3))
    assert (first.status_code, first["RateLimit"], first["RateLimit-Policy"]) == (
        200,
        '"default";r=1',
        '"default";q=2;w=60',
    )
    assert second["RateLimit"] == '"default";r=0'
    assert denied.status_code == 429
    assert denied["Content-Type"] == "application/json"
    assert denied.json() == {
        "error": {"code": "rate_limited", "message": "Too many requests; try again in 30 seconds.", "fields": {}}
    }
    assert (denied["Retry-After"], denied["RateLimit"]) == ("30", '"default";r=0;t=30')
    assert calls == ["/export/report"] * 2  # the denied request never reached the view


def test_the_middleware_allows_again_once_the_clock_moves_on(client, middleware, clock):
    get(client, "/export/report")
    get(client, "/export/report")
    clock.advance(29.9)
    assert get(client, "/export/report")["Retry-After"] == "1"
    clock.advance(0.1)
    assert get(client, "/export/report").status_code == 200


def test_the_middleware_keeps_clients_apart(client, middleware):
    get(client, "/export/report", "10.0.0.1")
    get(client, "/export/report", "10.0.0.1")
    assert get(client, "/export/report", "10.0.0.1").status_code == 429
    assert get(client, "/export/report", "10.0.0.2").status_code == 200
    assert get(client, "/export/report", "10.0.0.3").status_code == 200


@pytest.mark.django_db
def test_behind_the_authentication_middleware_a_logged_in_user_is_the_client(client, middleware, django_user_model):
    client.force_login(django_user_model.objects.create_user("bob"))
    get(client, "/export/report", "10.0.0.1")
    get(client, "/export/report", "10.0.0.2")
    assert get(client, "/export/report", "10.0.0.3").status_code == 429


def test_without_its_setting_the_middleware_steps_aside(client, settings):
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE_PATH]
    answers = [get(client, "/export/report") for _ in range(5)]
    assert [a.status_code for a in answers] == [200] * 5
    assert "RateLimit" not in answers[0]


def test_a_bad_middleware_setting_stops_start_up(settings):
    settings.LIMITER_MIDDLEWARE = {"rate": "2/min", "paths": "/export/"}
    with pytest.raises(ImproperlyConfigured, match=r'LIMITER_MIDDLEWARE\["paths"\]'):
        LimiterMiddleware(lambda request: None)


# The header fields ------------------------------------------------------------------------


def denied(retry_after, remaining=0.0, reason="RATE_LIMITED"):
    return Decision(False, retry_after, "client: token_bucket(10, 1/s)", reason, remaining)


def test_an_allowed_decision_reports_the_room_left_rounded_down_without_a_reset():
    headers = ratelimit_headers(Decision(True, remaining=7.9), quota=10, window=10)
    assert headers == {"RateLimit-Policy": '"default";q=10;w=10', "RateLimit": '"default";r=7'}


def test_a_denial_reports_the_wait_rounded_up_as_t():
    assert ratelimit_headers(denied(2.2), 10, 10)["RateLimit"] == '"default";r=0;t=3'


def test_float_noise_on_a_whole_second_wait_does_not_add_a_second():
    assert retry_after_header(3.0000000000004) == "3"
    assert ratelimit_headers(denied(3.0000000000004), 10, 10)["RateLimit"] == '"default";r=0;t=3'


def test_retry_after_is_whole_seconds_rounded_up_and_zero_for_no_wait():
    assert [retry_after_header(s) for s in (0, 0.001, 1, 1.5, 59.99)] == ["0", "1", "1", "2", "60"]


def test_an_infinite_wait_has_no_retry_after_and_no_reset():
    with pytest.raises(ValueError):
        retry_after_header(math.inf)
    never = denied(math.inf, reason=COST_EXCEEDS_LIMIT)
    assert ratelimit_headers(never, 10, 10)["RateLimit"] == '"default";r=0'


def test_without_a_quota_there_is_no_policy_field_and_the_room_is_not_capped():
    assert ratelimit_headers(Decision(True, remaining=12.0), None, None) == {"RateLimit": '"default";r=12'}


def test_the_room_is_capped_at_the_quota_and_never_negative():
    assert ratelimit_headers(Decision(True, remaining=50.0), 10, 1)["RateLimit"] == '"default";r=10'
    assert ratelimit_headers(denied(1.0, remaining=-3.0), 10, 1)["RateLimit"] == '"default";r=0;t=1'


def test_an_unbounded_allowed_decision_has_no_ratelimit_field():
    # Nothing limited it: no rule at the levels asked, or a fail-open decision.
    unbounded = Decision(True, degraded=True)
    assert ratelimit_headers(unbounded, 10, 1) == {"RateLimit-Policy": '"default";q=10;w=1'}


def test_the_window_is_whole_seconds_rounded_up_at_least_one_and_left_out_when_unknown():
    decision = Decision(True, remaining=1.0)
    assert ratelimit_headers(decision, 5.7, 0.25)["RateLimit-Policy"] == '"default";q=5;w=1'
    assert ratelimit_headers(decision, 5, 2.5)["RateLimit-Policy"] == '"default";q=5;w=3'
    assert ratelimit_headers(decision, 5, None)["RateLimit-Policy"] == '"default";q=5'
    assert ratelimit_headers(decision, 5, math.inf)["RateLimit-Policy"] == '"default";q=5'


def test_the_policy_name_is_a_quoted_structured_field_string():
    headers = ratelimit_headers(Decision(True, remaining=1.0), 5, 1, name='a "b" \\c')
    assert headers["RateLimit-Policy"] == '"a \\"b\\" \\\\c";q=5;w=1'
    with pytest.raises(ValueError):
        ratelimit_headers(Decision(True), 5, 1, name="line\nbreak")


def test_the_advertised_policy_is_the_smallest_rule_with_its_own_window(clock):
    limiter = build_limit(
        {
            "rules": [
                {"type": "sliding_window", "limit": 600, "window": 60},
                {"type": "token_bucket", "capacity": 50, "per_second": 10},
                {"type": "fixed_window", "limit": 5, "window": 1, "shadow": True},
            ]
        },
        "LIMITER_THROTTLE",
        clock,
    ).limiter.limiter
    assert advertised_policy(limiter.levels["client"]) == (50.0, 5.0)
    buckets = build_limit(
        {"rules": [{"type": "token_bucket", "capacity": 3, "per_second": 0}, {"type": "concurrency", "limit": 2}]},
        "LIMITER_THROTTLE",
        clock,
    ).limiter.limiter
    assert advertised_policy(buckets.levels["client"]) == (2.0, None)
    assert advertised_policy([]) == (None, None)
