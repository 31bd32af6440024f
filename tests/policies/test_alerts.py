"""Alerts, end to end: decisions counted in the statistics on a real Redis, evaluation rounds
run by hand at a clock that moves only when told, and deliveries posted by the deliveries'
pool to a real HTTP receiver on loopback (tests/receiver.py).

The rounds are what each serving worker runs in its flushing thread; several AlertRounds here
are several workers. Their threads and the pool's reach the database on connections of their
own, so these tests commit (transactional_db).
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import threading
import time
from concurrent.futures import wait

import pytest
import redis
from django.core.exceptions import ValidationError
from django.db import connections

from core import ManualClock
from core.flusher import Flusher
from core.stats import DenialStats
from core.stores.redis import RedisStore
from policies.checks import check_alert_settings
from policies.compile import PolicyCache, install_policy_cache
from policies.models import Alert, AlertDelivery, AlertFiring, QuotaBand
from policies.policyfile import load_policy
from policies.services.alerts import ATTEMPTS, AlertRounds, backoff, band_of, count_bands, crossings, send_test
from policies.services.decisions import decide
from policies.services.jobs import JobPool
from policies.services.webhooks import Fired, alert_body, signature
from policies.telemetry import install_denial_stats
from tests.receiver import WAIT, Receiver

from .conftest import POLICY, START

pytestmark = pytest.mark.django_db(transaction=True)

INITECH = {"user": "u1", "team": "initech", "global": "*"}  # the free tier: 10 at once per user
SECRET = "s3cret-for-the-receiver"
FIVE_MINUTES = 300


@pytest.fixture
def clock():
    return ManualClock(START.timestamp() + 120)  # two minutes into a five-minute window


@pytest.fixture
def engine(transactional_db, redis_url, clock):
    """SPEC.md's example policy, committed, decided on a real Redis, counted in statistics there."""
    load_policy(copy.deepcopy(POLICY))
    store = RedisStore(url=redis_url)
    client = redis.Redis.from_url(redis_url, socket_timeout=2)
    stats = DenialStats(client=client, clock=clock, flush_every=None)
    install_policy_cache(PolicyCache(store=store, clock=clock, limiter_clock=clock))
    install_denial_stats(stats)
    yield stats
    install_policy_cache(None)
    install_denial_stats(None)
    store.close()
    client.close()


@pytest.fixture
def receiver():
    with Receiver() as receiver:
        yield receiver


def worker(clock) -> AlertRounds:
    """A worker's rounds, run by hand, with a deliveries' pool of its own: of one thread, as
    SQLite's in-memory test database refuses two writers at once (PostgreSQL does not)."""
    return AlertRounds(every=None, clock=clock, pool=JobPool("test-alerts", workers=1, waiting=20), flusher=Flusher())


def delivered(rounds: AlertRounds) -> None:
    """Wait until the deliveries the last round handed to the pool are done."""
    done, pending = wait(rounds.dispatched, timeout=WAIT)
    assert not pending
    for future in done:
        future.result()


def traffic(decisions: int, keys=INITECH) -> None:
    """`decisions` at one instant: the free tier's user bucket allows 10, denies the rest."""
    for _ in range(decisions):
        decide(keys)


def share_alert(url: str, name: str = "denials", threshold: float = 0.2, **fields) -> Alert:
    alert = Alert(name=name, kind="denied_share", threshold=threshold, window="5m", url=url, secret=SECRET, **fields)
    alert.full_clean()
    alert.save()
    return alert


def verified(request) -> bool:
    """What a receiver does: the HMAC-SHA256 of the exact body under the shared secret."""
    scheme, _, sent = request.headers["X-Limiter-Signature"].partition("=")
    expected = hmac.new(SECRET.encode(), request.body, hashlib.sha256).hexdigest()
    return scheme == "sha256" and hmac.compare_digest(sent, expected)


# --- the row and its invariants ---------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, field, reason",
    [
        ({"url": ""}, "url", "a webhook URL is required"),
        ({"url": "ftp://hooks.example.com/x"}, "url", "must be an http:// or https:// URL, not ftp:"),
        ({"url": "hooks.example.com/x"}, "url", "not one without a scheme"),
        ({"url": "javascript:alert(1)"}, "url", "must be an http:// or https:// URL"),
        ({"url": "http:///no-host"}, "url", "must name a host"),
        ({"url": "http://example.com:99999/"}, "url", "a port from 1 to 65535"),
        ({"url": "http://example.com/caf\u00e9"}, "url", "outside ASCII"),
        ({"url": "http://exa mple.com/"}, "url", "no spaces"),
        ({"threshold": 0}, "threshold", "above 0 and at most 1"),
        ({"threshold": 1.5}, "threshold", "above 0 and at most 1"),
        ({"window": ""}, "window", "a denied_share alert needs a window"),
        ({"window": "30s"}, "window", "from 1m to 24h"),
        ({"window": "25h"}, "window", "from 1m to 24h"),
        ({"kind": "quota_used"}, "window", "only a denied_share alert has a window"),
        ({"kind": "latency"}, "kind", "must be one of quota_used, denied_share"),
        ({"format": "xml"}, "format", "must be one of json, slack"),
        ({"secret": ""}, "secret", "a secret is required"),
    ],
)
def test_a_bad_alert_names_its_field_and_nothing_is_saved(transactional_db, fields, field, reason):
    given = {"name": "a", "kind": "denied_share", "threshold": 0.2, "window": "5m", "url": "https://x.io/h"}
    alert = Alert(**given | {"secret": SECRET} | fields)
    with pytest.raises(ValidationError) as refused:
        alert.full_clean()
    assert reason in " ".join(refused.value.message_dict[field])
    assert not Alert.objects.exists()


def test_a_quota_alert_may_reach_the_whole_limit_and_a_share_alert_internal_hosts(transactional_db):
    Alert(
        name="full", kind="quota_used", threshold=1.0, url="http://alertmanager:9093/hook", secret=SECRET
    ).full_clean()
    share_alert("http://10.0.0.7/x", threshold=1.0)


def test_the_history_of_an_alert_never_holds_its_secret(transactional_db):
    alert = share_alert("https://x.io/h")
    alert.threshold = 0.5
    alert.save()
    assert alert.history.count() == 2
    assert "secret" not in [field.name for field in Alert.history.model._meta.fields]


# --- denied share: fires once per window ------------------------------------------------------


def test_a_denied_share_above_the_threshold_is_delivered_once_signed(engine, receiver, clock):
    alert = share_alert(receiver.url)
    rounds = worker(clock)
    traffic(15)  # 10 allowed, 5 denied: a third denied
    engine.flush()
    assert rounds.run({"initech"}, clock()) == 1
    delivered(rounds)
    [request] = receiver.wait_for(1)
    window_start = int(clock() // FIVE_MINUTES * FIVE_MINUTES)
    assert request.json() == {
        "alert": "denials",
        "kind": "denied_share",
        "tenant": "initech",
        "level": None,
        "rule": None,
        "threshold": 0.2,
        "value": round(5 / 15, 6),
        "period_start": window_start,
        "resets_at": window_start + FIVE_MINUTES,
        "at": clock(),
        "test": False,
    }
    assert verified(request)
    assert request.headers["Content-Type"] == "application/json"
    firing = AlertFiring.objects.get()
    assert (firing.state, firing.attempts, firing.tenant, firing.body.encode()) == (
        "delivered",
        1,
        "initech",
        request.body,
    )
    log = AlertDelivery.objects.get()
    assert (log.alert, log.firing, log.attempt, log.status, log.ok, log.error) == (alert, firing, 1, 200, True, "")
    # Later rounds of the same window, however many denials more: nothing more.
    traffic(5)
    engine.flush()
    clock.advance(60)
    rounds.run({"initech"}, clock())
    assert rounds.dispatched == []
    assert len(receiver.requests) == 1


def test_a_share_at_or_under_the_threshold_fires_nothing(engine, receiver, clock):
    share_alert(receiver.url, threshold=5 / 15)  # "more than": exactly a third does not fire
    rounds = worker(clock)
    traffic(15)
    engine.flush()
    rounds.run({"initech"}, clock())
    assert not AlertFiring.objects.exists()


def test_each_threshold_fires_once(engine, receiver, clock):
    share_alert(receiver.url, "over-20", 0.2)
    share_alert(receiver.url, "over-30", 0.3)
    share_alert(receiver.url, "over-50", 0.5)
    rounds = worker(clock)
    traffic(15)
    engine.flush()
    rounds.run({"initech"}, clock())
    delivered(rounds)
    assert sorted(request.json()["alert"] for request in receiver.wait_for(2)) == ["over-20", "over-30"]
    assert AlertFiring.objects.count() == 2


def test_a_denied_share_fires_again_in_a_later_window_never_twice_within_one(engine, receiver, clock):
    share_alert(receiver.url)
    rounds = worker(clock)
    clock.advance(FIVE_MINUTES - 120 - 1)  # one second before the window's end
    traffic(15)
    engine.flush()
    rounds.run({"initech"}, clock())
    delivered(rounds)
    clock.advance(2)  # the next aligned window, one second in: within 5m of the last firing
    traffic(15, {**INITECH, "user": "u2"})
    engine.flush()
    rounds.run({"initech"}, clock())
    assert rounds.dispatched == []
    clock.advance(FIVE_MINUTES - 2)  # five minutes after the first: the same window still
    traffic(15, {**INITECH, "user": "u3"})
    engine.flush()
    rounds.run({"initech"}, clock())
    delivered(rounds)
    assert len(receiver.wait_for(2)) == 2
    firings = list(AlertFiring.objects.order_by("at").values_list("period_start", flat=True))
    assert firings[1] - firings[0] == FIVE_MINUTES


def test_another_tenant_fires_on_its_own(engine, receiver, clock):
    share_alert(receiver.url)
    rounds = worker(clock)
    traffic(15)
    traffic(15, {"user": "u1", "team": "umbrella", "global": "*"})
    engine.flush()
    assert rounds.run({"initech", "umbrella"}, clock()) == 2
    delivered(rounds)
    assert sorted(r.json()["tenant"] for r in receiver.wait_for(2)) == ["initech", "umbrella"]


def test_a_disabled_alert_fires_nothing(engine, receiver, clock):
    share_alert(receiver.url, enabled=False)
    rounds = worker(clock)
    traffic(15)
    engine.flush()
    rounds.run({"initech"}, clock())
    assert not AlertFiring.objects.exists()


def test_a_round_hears_of_its_tenants_from_the_statistics_flush(engine, receiver, clock):
    share_alert(receiver.url)
    rounds = worker(clock)
    engine.on_flush = rounds.tenants_flushed  # what policies.telemetry wires for the default statistics
    traffic(15)
    engine.flush()
    assert rounds.flush() == 1  # the tenants seen since the last round: initech
    delivered(rounds)
    assert receiver.wait_for(1)[0].json()["tenant"] == "initech"
    assert rounds.flush() == 0  # nobody seen since


# --- exactly once, across workers -------------------------------------------------------------


def run_at_once(workers: list[AlertRounds], tenants: set[str], now: float) -> None:
    """Each worker's round in a thread of its own, all let go at the same instant."""
    start = threading.Barrier(len(workers))
    failures = []

    def run(rounds: AlertRounds) -> None:
        try:
            start.wait(WAIT)
            rounds.run(tenants, now)
        except Exception as error:  # the test's thread reports it
            failures.append(error)
        finally:
            connections.close_all()  # this thread's: the test database is dropped at the end

    threads = [threading.Thread(target=run, args=(rounds,)) for rounds in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert failures == []


@pytest.mark.parametrize(
    "at_once",
    # SQLite's in-memory test database refuses a second writer rather than let it wait, so
    # there the workers take turns, each unaware of the others and each round's deliveries
    # done before the next: the same race of inserts, one after another.
    [pytest.param(True, marks=pytest.mark.postgres, id="at once"), pytest.param(False, id="one after another")],
)
def test_workers_evaluating_the_same_crossing_deliver_exactly_once(engine, receiver, clock, at_once):
    share_alert(receiver.url, "over-20", 0.2)
    share_alert(receiver.url, "over-30", 0.3)
    traffic(15)
    engine.flush()
    workers = [worker(clock) for _ in range(4)]
    if at_once:
        run_at_once(workers, {"initech"}, clock())
    else:
        for rounds in workers:
            rounds.run({"initech"}, clock())
            delivered(rounds)
    for rounds in workers:
        delivered(rounds)
    assert sorted(r.json()["alert"] for r in receiver.requests) == ["over-20", "over-30"]
    assert AlertFiring.objects.count() == 2
    assert AlertDelivery.objects.count() == 2
    # And again, later in the window: every worker knows it fired.
    for rounds in workers:
        rounds.run({"initech"}, clock())
        assert rounds.dispatched == []
    assert len(receiver.requests) == 2


# --- a receiver that fails, recovers, or is slow ----------------------------------------------


def test_a_failing_receiver_is_tried_again_with_backoff_until_it_takes_it(engine, receiver, clock):
    share_alert(receiver.url)
    receiver.statuses = [500, 503]
    rounds = worker(clock)
    traffic(15)
    engine.flush()
    rounds.run({"initech"}, clock())
    delivered(rounds)
    firing = AlertFiring.objects.get()
    assert (firing.state, firing.attempts, firing.next_attempt) == ("pending", 1, clock() + backoff(1))
    clock.advance(backoff(1) - 0.001)  # not yet
    rounds.run(set(), clock())
    assert rounds.dispatched == []
    clock.advance(0.001)
    rounds.run(set(), clock())
    delivered(rounds)
    firing.refresh_from_db()
    assert (firing.attempts, firing.next_attempt) == (2, clock() + backoff(2))
    assert backoff(2) == 2 * backoff(1)
    clock.advance(backoff(2))
    rounds.run(set(), clock())
    delivered(rounds)
    firing.refresh_from_db()
    assert (firing.state, firing.attempts) == ("delivered", 3)
    bodies = [request.body for request in receiver.wait_for(3)]
    assert bodies[0] == bodies[1] == bodies[2]  # the same bytes, the same signature, each time
    log = list(AlertDelivery.objects.order_by("attempt").values_list("attempt", "status", "ok", "error"))
    assert log == [
        (1, 500, False, "HTTP 500 Internal Server Error: the receiver is down"),
        (2, 503, False, "HTTP 503 Service Unavailable: the receiver is down"),
        (3, 200, True, ""),
    ]


def test_a_delivery_is_given_up_after_its_last_attempt(engine, receiver, clock):
    share_alert(receiver.url)
    receiver.statuses = [500] * 50
    rounds = worker(clock)
    traffic(15)
    engine.flush()
    rounds.run({"initech"}, clock())
    delivered(rounds)
    for attempt in range(1, ATTEMPTS):
        clock.advance(backoff(attempt))
        rounds.run(set(), clock())
        delivered(rounds)
    firing = AlertFiring.objects.get()
    assert (firing.state, firing.attempts) == ("failed", ATTEMPTS)
    clock.advance(86400)
    rounds.run(set(), clock())
    assert rounds.dispatched == []
    assert len(receiver.requests) == ATTEMPTS == AlertDelivery.objects.count()


def test_a_receiver_that_never_answers_is_an_error_in_the_log(engine, unreachable_redis_url, clock):
    # Nothing listens there: the connection is refused at once.
    alert = share_alert(unreachable_redis_url.replace("redis://", "http://"))
    rounds = worker(clock)
    traffic(15)
    engine.flush()
    rounds.run({"initech"}, clock())
    delivered(rounds)
    log = AlertDelivery.objects.get(alert=alert)
    assert (log.status, log.ok) == (None, False)
    assert "Connection refused" in log.error or "ConnectionRefusedError" in log.error


def test_no_decision_waits_for_a_slow_receiver(engine, receiver, clock):
    share_alert(receiver.url)
    receiver.hold()
    rounds = worker(clock)
    traffic(15)
    engine.flush()
    started = time.perf_counter()
    rounds.run({"initech"}, clock())
    round_took = time.perf_counter() - started
    receiver.wait_for(1)  # the delivery is in flight, and its answer held
    slowest = 0.0
    for _ in range(50):
        started = time.perf_counter()
        decide({"user": "u9", "team": "acme", "global": "*"})
        slowest = max(slowest, time.perf_counter() - started)
    assert not rounds.dispatched[0].done()  # still waiting on the receiver
    receiver.release()
    delivered(rounds)
    assert AlertFiring.objects.get().state == "delivered"
    # Loose bounds on a shared machine; the receiver holds for up to 30 s.
    assert round_took < 5.0, round_took
    assert slowest < 1.0, slowest


# --- test sends, and the bodies -------------------------------------------------------------------


def test_a_test_delivery_is_sent_now_and_logged(engine, receiver, clock):
    alert = share_alert(receiver.url)
    log = send_test(alert, clock)
    assert (log.ok, log.status, log.attempt, log.firing, log.test) == (True, 200, 1, None, True)
    [request] = receiver.wait_for(1)
    assert verified(request)
    assert request.json() | {"at": None} == {
        "alert": "denials",
        "kind": "denied_share",
        "tenant": None,
        "level": None,
        "rule": None,
        "threshold": 0.2,
        "value": None,
        "period_start": None,
        "resets_at": None,
        "at": None,
        "test": True,
    }
    assert request.headers["X-Limiter-Delivery"] == "test"


def test_a_slack_alert_posts_text_signed_the_same_way(engine, receiver, clock):
    share_alert(receiver.url, format="slack")
    rounds = worker(clock)
    traffic(15)
    engine.flush()
    rounds.run({"initech"}, clock())
    delivered(rounds)
    [request] = receiver.wait_for(1)
    assert verified(request)
    text = request.json()["text"]
    assert text.startswith("Limiter alert *denials*: tenant `initech` had 33.33% of its decisions denied")
    assert "over the last 5m (threshold 20%)" in text


def test_the_signature_is_hmac_sha256_of_the_exact_body():
    body = alert_body(Fired("a", "quota_used", "acme", "team", "quota(1000/day)", 0.8, 0.8125, 0, 86400), 12.5)
    assert signature(body, "k") == "sha256=" + hmac.new(b"k", body, hashlib.sha256).hexdigest()
    assert json.loads(body)["value"] == 0.8125


# --- quotas (the evaluation's side; end to end once the quota rule type is in core) ----------------


def quota(used, limit, level="team", rule="quota(1000/day)", start=86400, resets=2 * 86400):
    return {"level": level, "rule": rule, "used": used, "limit": limit, "period_start": start, "resets_at": resets}


def test_a_quota_at_or_past_the_threshold_crosses_it_once_per_rule_and_period(transactional_db):
    alert = Alert(name="q", kind="quota_used", threshold=0.8, url="https://x.io/h", secret=SECRET)
    quotas = [quota(799, 1000), quota(800, 1000, rule="quota(5000/month)"), quota(5, 0)]
    found = list(crossings([alert], "acme", 1.0, quotas, {}))
    assert [(c.level, c.rule, c.period_start, c.resets_at, c.value) for c in found] == [
        ("team", "quota(5000/month)", 86400, 2 * 86400, 0.8)
    ]
    credits = list(crossings([alert], "acme", 1.0, [quota(900, 1000, start=None, resets=None)], {}))
    assert [(c.period_start, c.resets_at) for c in credits] == [(0, None)]


def test_the_quota_bands_count_tenants_without_naming_them(transactional_db, clock):
    rounds = worker(clock)
    now = clock()
    rounds.note_band("acme", [quota(950, 1000, resets=now + 60), quota(100, 1000)])
    rounds.note_band("initech", [quota(1000, 1000, resets=now + 60)])
    rounds.note_band("umbrella", [quota(810, 1000, start=None, resets=None), quota(820, 1000, resets=now + 5)])
    rounds.note_band("hooli", [quota(10, 1000)])
    assert band_of([quota(950, 1000, resets=now + 60)]) == (90, int(now + 60))
    assert band_of([quota(950, 1000, resets=now + 60), quota(900, 1000, resets=now + 90)]) == (90, int(now + 90))
    assert band_of([quota(10, 1000, resets=now + 60)]) == (0, None)
    assert count_bands(now) == {80: 3, 90: 2, 100: 1}
    assert count_bands(now + 61) == {80: 1, 90: 0, 100: 0}  # the two periods ended
    rounds.note_band("acme", [quota(10, 1000, resets=now + 86400)])  # a new period
    assert count_bands(now) == {80: 2, 90: 1, 100: 1}
    assert sorted(QuotaBand.objects.values_list("tenant", flat=True)) == ["initech", "umbrella"]


# --- quotas, end to end: the quota rule on a real Redis ----------------------------------------

ACME = {"user": "u1", "team": "acme", "global": "*"}
DAY = 86400


@pytest.fixture
def quotas(engine):
    """Tenant acme with a daily quota of 10 and a balance of 10 credits at its team level."""
    policy = copy.deepcopy(POLICY)
    policy["tenants"]["acme"]["overrides"] = {
        "team": [
            {"type": "quota", "limit": 10, "period": "day", "label": "DAILY"},
            {"type": "quota", "limit": 10, "period": "none", "label": "CREDITS"},
        ]
    }
    load_policy(policy)
    return engine


def quota_alert(url: str, name: str = "quota-80", threshold: float = 0.8, **fields) -> Alert:
    alert = Alert(name=name, kind="quota_used", threshold=threshold, url=url, secret=SECRET, **fields)
    alert.full_clean()
    alert.save()
    return alert


def spend(cost: float) -> None:
    assert decide(ACME, cost).decision.allowed


def test_a_quota_past_its_threshold_fires_once_per_rule_and_period(quotas, receiver, clock):
    quota_alert(receiver.url)
    rounds = worker(clock)
    spend(7)
    rounds.run({"acme"}, clock())
    assert rounds.dispatched == []  # 70 %
    spend(1)  # 80 % of both the day's quota and the credits
    rounds.run({"acme"}, clock())
    delivered(rounds)
    day = int(clock() // DAY * DAY)
    bodies = sorted((r.json() for r in receiver.wait_for(2)), key=lambda body: body["rule"])
    assert all(verified(request) for request in receiver.requests)
    assert [(b["level"], b["rule"], b["value"], b["period_start"], b["resets_at"]) for b in bodies] == [
        ("team", "quota(10 credits)", 0.8, None, None),
        ("team", "quota(10/day)", 0.8, day, day + DAY),
    ]
    assert {(b["alert"], b["kind"], b["tenant"], b["threshold"]) for b in bodies} == {
        ("quota-80", "quota_used", "acme", 0.8)
    }
    spend(1)
    rounds.run({"acme"}, clock())
    assert rounds.dispatched == []  # the same periods: nothing more
    # The next day: the day's quota starts again from nothing and fires again at 80 %; the
    # credits do not reset, and having fired, stay quiet.
    clock.advance(DAY)
    spend(1)  # credits: 100 %, the day: 10 %
    rounds.run({"acme"}, clock())
    assert rounds.dispatched == []
    for _ in range(7):
        assert decide(ACME, 1).decision.allowed is False  # out of credits: hard, denied
    assert AlertFiring.objects.count() == 2


def test_each_threshold_of_a_quota_fires_on_its_own(quotas, receiver, clock):
    for share in (0.8, 0.9, 1.0):
        quota_alert(receiver.url, f"quota-{share * 100:.0f}", share)
    rounds = worker(clock)
    spend(9)
    rounds.run({"acme"}, clock())
    delivered(rounds)
    assert sorted(r.json()["alert"] for r in receiver.wait_for(4)) == ["quota-80"] * 2 + ["quota-90"] * 2
    spend(1)
    rounds.run({"acme"}, clock())
    delivered(rounds)
    assert sorted(r.json()["alert"] for r in receiver.wait_for(6)[4:]) == ["quota-100", "quota-100"]


def test_a_top_up_rearms_a_balance_of_credits(quotas, receiver, clock):
    quota_alert(receiver.url)
    rounds = worker(clock)
    spend(8)
    rounds.run({"acme"}, clock())
    delivered(rounds)
    assert len(receiver.wait_for(2)) == 2  # the day's and the credits'
    limiter = quotas_limiter()
    assert limiter.top_up("team", "acme", "CREDITS", 5) == 7  # 3 used of 10: under 80 % again
    rounds.run({"acme"}, clock())
    assert rounds.dispatched == []
    other = worker(clock)  # a worker that never saw it under the threshold fires it all the same
    clock.advance(DAY)  # a new day: its quota has room again, the credits do not reset
    spend(5)  # credits: 8 of 10 used again; the day: 5 of 10
    other.run({"acme"}, clock())
    delivered(other)
    credits = [r.json() for r in receiver.wait_for(3) if r.json()["rule"] == "quota(10 credits)"]
    assert len(credits) == 2
    firings = AlertFiring.objects.filter(rule="quota(10 credits)").order_by("at")
    assert [f.period_start for f in firings] == [-firings[0].pk, 0]  # the first kept, with its log


def test_the_quota_bands_follow_the_tenants_quotas(quotas, clock):
    rounds = worker(clock)
    spend(9)
    rounds.run({"acme", "initech"}, clock())
    assert count_bands(clock()) == {80: 1, 90: 1, 100: 0}
    from policies.metrics import QUOTA_TENANTS  # read here: the gauge the round set

    assert QUOTA_TENANTS.labels("90")._value.get() == 1
    clock.advance(DAY)  # the day's quota ends its period; the credits stay at 90 %
    rounds.run(set(), clock())
    assert count_bands(clock()) == {80: 1, 90: 1, 100: 0}


def quotas_limiter():
    from policies.compile import policy_cache  # the engine fixture's, installed for the test

    return policy_cache().limiter_for("acme")


# --- settings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, value",
    [
        ("LIMITER_ALERT_EVERY", -1.0),
        ("LIMITER_ALERT_TIMEOUT", 0.0),
        ("LIMITER_ALERT_ATTEMPTS", 0),
        ("LIMITER_ALERT_ATTEMPTS", 2.5),
        ("LIMITER_ALERT_BACKOFF", float("nan")),
    ],
)
def test_a_bad_alert_setting_is_refused_at_start_up(settings, name, value):
    setattr(settings, name, value)
    [error] = check_alert_settings()
    assert error.id == "policies.E008" and error.msg.startswith(name)


def test_the_alert_settings_default_to_what_the_docs_say():
    assert check_alert_settings() == []
    assert (ATTEMPTS, backoff(1), backoff(3)) == (8, 5.0, 20.0)
