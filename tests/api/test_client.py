"""The Python client of the REST API (core/client.py).

The waiting logic is tested first on the real engine, in-process, with a manual clock. Then
the client talks to the real API, served by pytest-django's live server in this process: its
policy cache runs on the same manual clock that the client sleeps on, so the waits are exact
and no test sleeps for real.
"""

import datetime as dt
import math
import socket

import pytest

from core import HierarchicalLimiter, ManualClock
from core.client import (
    LimiterAPIError,
    LimiterClient,
    LimiterUnavailable,
    RateLimited,
    RemoteReservation,
    decision_from_json,
    wait_until_allowed,
)
from core.decision import COST_EXCEEDS_LIMIT

from .conftest import make_token


class RecordedSleep:
    """A sleep that moves the manual clock on and remembers each wait."""

    def __init__(self, clock):
        self.clock = clock
        self.waits = []

    def __call__(self, seconds):
        self.waits.append(round(seconds, 6))
        self.clock.sleep(seconds)


def bucket(capacity, per_second):
    return {"type": "token_bucket", "capacity": capacity, "per_second": per_second}


# Waiting, on the engine in-process ---------------------------------------------------------


@pytest.fixture
def engine_clock():
    return ManualClock()


@pytest.fixture
def sleep(engine_clock):
    return RecordedSleep(engine_clock)


def waiter(rules, clock, sleep, cost=1):
    limiter = HierarchicalLimiter.from_config({"user": rules}, clock=clock)
    return lambda timeout: wait_until_allowed(lambda: limiter.acquire({"user": "u1"}, cost), timeout, clock, sleep)


def test_five_waits_on_a_bucket_of_three_at_one_per_second_go_at_0_0_0_1_2(engine_clock, sleep):
    acquire = waiter([bucket(3, 1)], engine_clock, sleep)
    sent_at = []
    for _ in range(5):
        assert acquire(10.0).allowed
        sent_at.append(engine_clock())
    assert sent_at == [0, 0, 0, 1, 2]
    assert sleep.waits == [1.0, 1.0]


def test_a_wait_that_would_end_past_the_timeout_returns_the_denial_without_sleeping(engine_clock, sleep):
    acquire = waiter([bucket(1, 0.25)], engine_clock, sleep)
    acquire(10.0)
    denial = acquire(3.9)
    assert not denial.allowed and denial.retry_after == 4.0
    assert sleep.waits == [] and engine_clock() == 0


def test_it_never_sleeps_past_the_deadline(engine_clock, sleep):
    acquire = waiter([bucket(2, 1)], engine_clock, sleep, cost=2)
    acquire(10.0)
    assert acquire(2.0).allowed  # the wait of exactly 2 s ends on the deadline
    assert sleep.waits == [2.0]
    start = engine_clock()
    assert not acquire(1.5).allowed
    assert engine_clock() - start <= 1.5


def test_a_wait_that_never_ends_gives_up_at_once_even_without_a_timeout(engine_clock, sleep):
    acquire = waiter([bucket(1, 0)], engine_clock, sleep)
    acquire(None)
    denial = acquire(None)
    assert not denial.allowed and math.isinf(denial.retry_after)
    assert sleep.waits == []


def test_without_a_timeout_it_waits_as_long_as_it_takes(engine_clock, sleep):
    acquire = waiter([bucket(1, 0.001)], engine_clock, sleep)
    acquire(None)
    assert acquire(None).allowed
    assert sleep.waits == [1000.0]


def test_a_timeout_of_zero_takes_only_what_is_there_now(engine_clock, sleep):
    acquire = waiter([bucket(2, 1)], engine_clock, sleep)
    assert [acquire(0).allowed for _ in range(3)] == [True, True, False]
    assert sleep.waits == []


# Reading the API's JSON ---------------------------------------------------------------------


def test_a_null_retry_after_or_remaining_is_infinite():
    decision = decision_from_json(
        {
            "allowed": False,
            "retry_after": None,
            "blocked_by": "user: x",
            "reason": COST_EXCEEDS_LIMIT,
            "remaining": None,
            "degraded": False,
        }
    )
    assert math.isinf(decision.retry_after) and math.isinf(decision.remaining)
    assert decision.reason == COST_EXCEEDS_LIMIT


def test_an_answer_that_is_no_decision_is_an_api_error():
    with pytest.raises(LimiterAPIError) as raised:
        decision_from_json({"detail": "hello"}, 200)
    assert raised.value.code == "bad_response"


def test_a_base_url_must_be_http_or_https():
    with pytest.raises(ValueError):
        LimiterClient("ftp://example.com", "t")


def test_a_server_that_is_not_there_is_limiter_unavailable():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again before the client tries it
    client = LimiterClient(f"http://127.0.0.1:{port}", "t", timeout=0.5)
    with pytest.raises(LimiterUnavailable):
        client.decide({"user": "u1"})


# Against the real API -----------------------------------------------------------------------

LIMITS = {
    "default_tier": "t",
    "levels": [{"name": "user"}, {"name": "team"}, {"name": "gpu"}],
    "tiers": {
        "t": {
            "user": [bucket(3, 1)],
            "team": [bucket(1000, 0)],
            "gpu": [{"type": "concurrency", "limit": 2, "lease": 30}],
        }
    },
}
KEYS = {"user": "u1", "team": "lab"}
GPU = {"gpu": "a100"}


@pytest.fixture
def api_sleep(clock):
    return RecordedSleep(clock)


@pytest.fixture
def client(live_server, memory_engine, load, clock, api_sleep):
    """A client with a decide-scope token, sleeping on the server's own manual clock."""
    load(LIMITS)
    with LimiterClient(live_server.url, make_token("decide"), clock=clock, sleep=api_sleep) as client:
        yield client


def test_an_allowed_decision_comes_back_as_a_decision(client):
    decision = client.decide(KEYS)
    assert decision.allowed and decision.retry_after == 0 and decision.reason == "OK"
    assert decision.remaining == 2 and decision.degraded is False


def test_a_denial_says_how_long_to_wait_and_what_blocked(client):
    for _ in range(3):
        client.decide(KEYS)
    denial = client.decide(KEYS)
    assert not denial.allowed
    assert denial.retry_after == pytest.approx(1.0)
    assert denial.blocked_by == "user: token_bucket(3, 1/s)"


def test_a_cost_that_can_never_fit_has_an_infinite_retry_after(client):
    denial = client.decide(KEYS, cost=5)
    assert not denial.allowed and math.isinf(denial.retry_after)
    assert denial.reason == COST_EXCEEDS_LIMIT


def test_a_dry_run_takes_nothing(client):
    assert client.decide(KEYS, cost=3, dry_run=True).allowed
    assert client.decide(KEYS, cost=3).allowed


def test_a_batch_is_decided_in_order(client):
    decisions = client.decide_batch([{"keys": KEYS, "cost": 2}, {"keys": KEYS, "cost": 2}, {"keys": {"user": "u2"}}])
    assert [d.allowed for d in decisions] == [True, False, True]
    assert decisions[1].retry_after == pytest.approx(1.0)


def test_acquire_waits_on_the_servers_retry_after(client, clock, api_sleep):
    start = clock()
    sent_at = []
    for _ in range(5):
        assert client.acquire(KEYS, timeout=10.0).allowed
        sent_at.append(round(clock() - start, 6))
    assert sent_at == [0, 0, 0, 1, 2]
    assert api_sleep.waits == [1.0, 1.0]


def test_acquire_gives_up_with_the_denial_when_the_wait_outlasts_the_timeout(client, clock, api_sleep):
    assert client.acquire(KEYS, cost=3).allowed
    start = clock()
    denial = client.acquire(KEYS, cost=3, timeout=2.5)  # needs 3 s
    assert not denial.allowed and denial.retry_after == pytest.approx(3.0)
    assert clock() == start and api_sleep.waits == []
    assert client.acquire(KEYS, cost=3, timeout=3.0).allowed
    assert api_sleep.waits == [pytest.approx(3.0)]


def test_acquire_of_a_cost_that_never_fits_returns_at_once(client, api_sleep):
    denial = client.acquire(KEYS, cost=50, timeout=60.0)
    assert not denial.allowed and denial.reason == COST_EXCEEDS_LIMIT
    assert api_sleep.waits == []


def test_a_reservation_commits_its_actual_cost_on_leaving_the_block(client, clock):
    team = {"team": "lab"}
    with client.reserve(team, cost=80) as reservation:
        assert isinstance(reservation, RemoteReservation) and reservation.allowed and reservation.id
        assert reservation.expires_at > dt.datetime.now(dt.UTC)
        reservation.actual_cost = 30
    assert reservation.settled
    assert reservation.settlement["status"] == "committed" and reservation.settlement["refunded"] == 50
    assert client.decide(team, cost=970, dry_run=True).allowed
    assert not client.decide(team, cost=971, dry_run=True).allowed


def test_without_an_actual_cost_the_estimate_is_committed(client):
    with client.reserve({"team": "lab"}, cost=10) as reservation:
        pass
    assert reservation.settlement["refunded"] == 0 and reservation.settlement["charged"] == 0


def test_an_exception_in_the_block_cancels_the_reservation_and_goes_on(client):
    with pytest.raises(ZeroDivisionError):
        with client.reserve({"team": "lab"}, cost=400) as reservation:
            raise ZeroDivisionError
    assert reservation.settlement["status"] == "cancelled" and reservation.settlement["refunded"] == 400
    assert client.decide({"team": "lab"}, cost=1000, dry_run=True).allowed


def test_a_denied_reservation_raises_rate_limited_and_the_block_never_runs(client):
    first, second = client.reserve(GPU), client.reserve(GPU)  # both slots
    ran = []
    with pytest.raises(RateLimited) as raised:
        with client.reserve(GPU):
            ran.append(True)
    assert ran == []
    assert not raised.value.decision.allowed
    assert raised.value.decision.blocked_by.startswith("gpu: concurrency(2")
    first.cancel()
    with client.reserve(GPU):
        pass
    second.commit()


def test_settling_twice_is_a_409_and_an_unknown_id_a_404(client):
    reservation = client.reserve({"team": "lab"}, cost=5)
    reservation.commit(5)
    with pytest.raises(LimiterAPIError) as raised:
        reservation.commit(5)
    assert (raised.value.status, raised.value.code) == (409, "conflict")
    reservation.id = "no-such-reservation"
    with pytest.raises(LimiterAPIError) as raised:
        reservation.cancel()
    assert raised.value.status == 404 and raised.value.code == "not_found"


def test_a_bad_request_is_an_api_error_naming_the_field(client):
    with pytest.raises(LimiterAPIError) as raised:
        client.decide(KEYS, cost=-1)
    assert (raised.value.status, raised.value.code) == (400, "invalid")
    assert "cost" in raised.value.fields
    with pytest.raises(LimiterAPIError) as raised:
        client.decide({"planet": "mars"})
    assert "keys.planet" in raised.value.fields


def test_a_bad_token_is_a_401(live_server, memory_engine, load):
    load(LIMITS)
    with LimiterClient(live_server.url, "la_not-a-token") as client:
        with pytest.raises(LimiterAPIError) as raised:
            client.decide(KEYS)
    assert raised.value.status == 401 and raised.value.code == "authentication_failed"


def test_a_path_that_is_not_the_api_is_an_error_not_a_decision(live_server, memory_engine, load):
    load(LIMITS)
    with LimiterClient(live_server.url + "/nowhere", make_token("decide")) as client:
        with pytest.raises(LimiterAPIError) as raised:
            client.decide(KEYS)
    assert raised.value.status == 404


def test_one_client_serves_many_requests_and_threads(client):
    import threading

    answers = []

    def work():
        answers.extend(client.decide({"user": f"t{threading.get_ident()}-{i}"}).allowed for i in range(10))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [True] * 40


def test_a_kept_alive_connection_that_broke_while_idle_is_replaced_once(client):
    assert client.decide({"user": "idle"}).allowed
    connection = client._local.connection
    assert connection.sock is not None  # kept alive after the first answer
    connection.sock.shutdown(socket.SHUT_RDWR)  # as if the server had dropped it meanwhile
    assert client.decide({"user": "idle"}).remaining == 1  # sent once more, decided once
