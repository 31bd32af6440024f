"""The decision record: what is kept, in process and in a real Redis stream, and what a flush
does when Redis is gone."""

import time

import pytest
import redis

from core import ConfigError, Decision, ManualClock
from core.recorder import (
    DECISION,
    RELEASE,
    RESERVATION,
    SETTLEMENT,
    DecisionRecorder,
    Record,
    check_limit,
    decode,
    encode,
)

ACME = {"user": "u1", "team": "acme", "global": "*"}
DENIED = Decision(False, 2.0, "team: token_bucket(3, 1/s)", "RATE_LIMITED")
LEASED = Decision(True, lease="lease-7")


def record_every_kind(recorder, clock):
    recorder.decision(ACME, 1, None, Decision(True))
    clock.advance(0.25)
    recorder.decision(ACME, 2.5, "batch", DENIED)
    clock.advance(0.25)
    recorder.decision({"team": "acme"}, 1, None, LEASED)
    recorder.reservation(ACME, 4000, "interactive", 30.0, Decision(True), "res-1")
    recorder.reservation(ACME, 9000, None, None, DENIED, None)
    clock.advance(1)
    recorder.settlement("res-1", 1312)
    recorder.settlement("res-2", None)
    recorder.release({"team": "acme"}, "lease-7")


EVERY_KIND = [
    Record(100.0, DECISION, ACME, 1, None, True, None, None, None),
    Record(100.25, DECISION, ACME, 2.5, "batch", False, "team: token_bucket(3, 1/s)", None, None),
    Record(100.5, DECISION, {"team": "acme"}, 1, None, True, None, "lease-7", None),
    Record(100.5, RESERVATION, ACME, 4000, "interactive", True, None, "res-1", 30.0),
    Record(100.5, RESERVATION, ACME, 9000, None, False, "team: token_bucket(3, 1/s)", None, None),
    Record(101.5, SETTLEMENT, {}, 1312, None, True, None, "res-1", None),
    Record(101.5, SETTLEMENT, {}, None, None, True, None, "res-2", None),
    Record(101.5, RELEASE, {"team": "acme"}, None, None, True, None, "lease-7", None),
]


@pytest.fixture
def clock():
    return ManualClock(100.0)


@pytest.fixture(params=["memory", "redis"])
def make_recorder(request, clock):
    """Recorders on one log: in process, or every one on the same real Redis stream."""
    if request.param == "memory":
        shared = DecisionRecorder(clock=clock, flush_every=None)
        return lambda limit=1000: shared
    client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    return lambda limit=1000: DecisionRecorder(client=client, limit=limit, clock=clock, flush_every=None)


def test_every_kind_of_record_reads_back_as_it_was_recorded(make_recorder, clock):
    recorder = make_recorder()
    record_every_kind(recorder, clock)
    assert recorder.records(0, 200) == EVERY_KIND


def test_a_record_encodes_and_decodes_to_itself():
    for record in EVERY_KIND:
        assert decode({name.encode(): str(value).encode() for name, value in encode(record).items()}) == record


def test_records_are_read_for_the_window_oldest_first_whichever_worker_flushed_first(make_recorder, clock):
    early, late = make_recorder(), make_recorder()
    late.decision({"team": "late"}, 1, None, Decision(True))  # at 100
    clock.advance(1)
    early.decision({"team": "early"}, 1, None, Decision(True))  # at 101
    clock.advance(1)
    late.decision({"team": "late"}, 1, None, Decision(True))  # at 102
    early.flush()
    late.flush()
    assert [(r.time, r.keys["team"]) for r in late.records(0, 200)] == [(100, "late"), (101, "early"), (102, "late")]
    assert [r.time for r in late.records(100.5, 101.5)] == [101]


def test_the_most_recent_records_are_kept_when_traffic_outruns_the_limit(clock):
    recorder = DecisionRecorder(limit=50, clock=clock, flush_every=None)
    for i in range(120):
        clock.now = 100 + i
        recorder.decision({"team": f"t{i}"}, 1, None, Decision(True))
        if i % 7 == 0:
            recorder.flush()
    kept = recorder.records(0, 1000)
    assert [r.keys["team"] for r in kept] == [f"t{i}" for i in range(70, 120)]


def test_redis_trims_the_stream_to_about_the_limit(redis_url, clock):
    client = redis.Redis.from_url(redis_url)
    recorder = DecisionRecorder(client=client, limit=150, clock=clock, flush_every=None)
    for i in range(1000):
        clock.now = 100 + i
        recorder.decision({"team": f"t{i}"}, 1, None, Decision(True))
        if i % 100 == 99:
            recorder.flush()
    kept = recorder.records(0, 2000)
    # MAXLEN ~ trims whole stream nodes (100 entries each): at least the limit stays, and
    # less than a node more; always the newest.
    assert 150 <= len(kept) < 250
    assert kept[-1].keys["team"] == "t999" and [r.time for r in kept] == sorted(r.time for r in kept)


def test_a_buffer_between_flushes_holds_at_most_the_limit(clock):
    recorder = DecisionRecorder(limit=10, clock=clock, flush_every=None)
    for i in range(25):
        recorder.decision({"team": f"t{i}"}, 1, None, Decision(True))
    assert recorder.flush() == 10
    assert [r.keys["team"] for r in recorder.records(0, 200)] == [f"t{i}" for i in range(15, 25)]


def test_a_flush_while_redis_is_unreachable_loses_its_records_and_raises_nothing(unreachable_redis_url, clock):
    client = redis.Redis.from_url(unreachable_redis_url, socket_connect_timeout=0.2, socket_timeout=0.2)
    recorder = DecisionRecorder(client=client, clock=clock, flush_every=None)
    for _ in range(3):
        recorder.decision(ACME, 1, None, Decision(True))
    assert recorder.flush() == 0
    assert recorder.lost == 3
    assert recorder.flush() == 0 and recorder.lost == 3  # nothing left to lose


def test_a_recorder_flushes_by_itself_from_its_own_thread(clock):
    recorder = DecisionRecorder(clock=clock, flush_every=0.01)
    recorder.decision(ACME, 1, None, Decision(True))
    for _ in range(500):
        if len(recorder.log):
            break
        time.sleep(0.01)  # waiting for the thread, not an edge: any pace will do
    assert len(recorder.log) == 1
    recorder.close()


@pytest.mark.parametrize("limit", [-1, 1.5, True, "200000"])
def test_a_limit_is_a_whole_number_of_records(limit):
    with pytest.raises(ConfigError, match="must be a whole number of records"):
        check_limit(limit)
    assert check_limit(0) == 0


def test_a_recorder_needs_a_limit_above_zero(clock):
    with pytest.raises(ConfigError, match="at least one record"):
        DecisionRecorder(limit=0, clock=clock)
