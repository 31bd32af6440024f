"""The flusher: one thread per process writes out every buffer, each by its own schedule, and
what a store error does to a buffer is the buffer's declared policy (drop, or keep and retry)."""

import gc
import logging
import os
import threading
import time
import weakref

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from core import Decision, ManualClock
from core.errors import StoreUnavailable
from core.flusher import DROP, FLUSHER, KEEP, Flushable, Flusher
from core.recorder import DecisionRecorder
from core.stats import DenialStats

ACME = {"user": "u1", "team": "acme"}


class Buffer(Flushable):
    """A list of items, written to `written`; `fail` is raised by every write while set."""

    what = "test buffer"

    def __init__(self, policy=DROP, flush_every=None, flusher=None, fail=None):
        self.on_store_error = policy
        self.items, self.written, self.fail = [], [], fail
        super().__init__(flush_every, flusher)

    def add(self, *items):
        self.items.extend(items)
        return self

    def take(self):
        batch, self.items = self.items, []
        return batch or None

    def write(self, batch):
        if self.fail is not None:
            raise self.fail
        self.written += batch
        return len(batch)

    def keep(self, batch):
        self.items = batch + self.items


def eventually(condition, seconds=5.0):
    """Poll for the thread's work: waiting for it, not aiming at an edge."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return condition()


@pytest.fixture
def clock():
    return ManualClock(100.0)


@pytest.fixture
def flusher(clock):
    """A flusher of the test's own on a clock moved by hand: its rounds run in the test."""
    return Flusher(clock)


# --- the schedule --------------------------------------------------------------------------


def test_each_flushable_is_flushed_when_its_own_flush_every_has_passed(flusher, clock):
    often, seldom = Buffer(flush_every=1, flusher=flusher), Buffer(flush_every=5, flusher=flusher)
    often.add("a"), seldom.add("b")
    assert flusher.flush_due() == 101.0  # nothing due yet; the next at 101
    clock.advance(1)
    assert flusher.flush_due() == 102.0
    assert (often.written, seldom.written) == (["a"], [])
    clock.advance(4)
    flusher.flush_due()
    assert seldom.written == ["b"]


class Busy(Buffer):
    """A buffer whose write burns `cpu` seconds of this thread's CPU."""

    what = "busy buffer"

    def __init__(self, cpu, **kwargs):
        self.cpu = cpu
        super().__init__(**kwargs)

    def write(self, batch):
        until = time.thread_time() + self.cpu
        while time.thread_time() < until:
            pass
        return super().write(batch)


def test_each_scheduled_flush_tells_the_cpu_it_took_in_its_thread(flusher, clock):
    told = []
    flusher.on_flushed = lambda what, seconds: told.append((what, seconds))
    busy = Busy(0.02, flush_every=1, flusher=flusher).add("a")
    idle = Buffer(flush_every=1, flusher=flusher)  # nothing to write: a flush all the same
    clock.advance(1)
    flusher.flush_due()
    assert sorted(what for what, _ in told) == ["busy buffer", "test buffer"]
    spent = dict(told)
    assert spent["busy buffer"] >= 0.02 and spent["test buffer"] < 0.02
    assert busy.written == ["a"] and idle.written == []


def test_a_flushable_dropped_by_its_owner_is_let_go_and_never_flushed_again(flusher, clock):
    dropped = Buffer(flush_every=1, flusher=flusher).add("a")
    kept = Buffer(flush_every=1, flusher=flusher)
    gone = weakref.ref(dropped)
    del dropped
    gc.collect()
    assert gone() is None  # the flusher held it weakly
    clock.advance(1)
    flusher.flush_due()
    assert len(flusher) == 1  # only `kept` is scheduled again
    assert kept.flush_every == 1


def test_a_closed_flushable_is_flushed_once_more_and_then_left_alone(flusher, clock):
    buffer = Buffer(flush_every=1, flusher=flusher).add("a")
    buffer.close()
    assert buffer.written == ["a"]
    clock.advance(1)
    assert flusher.flush_due() is None and len(flusher) == 0


def test_a_failing_flushable_does_not_stop_the_others(flusher, clock, caplog):
    class Broken(Buffer):
        def flush(self):
            raise RuntimeError("a bug in an override")

    broken = Broken(flush_every=1, flusher=flusher).add("x")
    buggy = Buffer(flush_every=1, flusher=flusher, fail=ZeroDivisionError()).add("y")
    fine = Buffer(flush_every=1, flusher=flusher)
    for round_ in range(3):
        fine.add(round_)
        clock.advance(1)
        flusher.flush_due()
    assert fine.written == [0, 1, 2]
    assert buggy.lost == 1 and len(flusher) == 3  # every one of them is still scheduled
    assert broken.items == ["x"]
    assert "a bug in an override" in caplog.text and "ZeroDivisionError" in caplog.text


def test_a_wake_flushes_every_flushable_before_it_is_due(flusher, clock):
    buffers = [Buffer(flush_every=3600, flusher=flusher).add(i) for i in range(2)]
    flusher.flush_due(everything=True)
    assert [b.written for b in buffers] == [[0], [1]]


# --- the thread ----------------------------------------------------------------------------


def test_one_thread_flushes_every_flushable_of_the_process():
    recorder = DecisionRecorder(flush_every=0.01)
    stats = DenialStats(flush_every=0.01)
    buffer = Buffer(flush_every=0.01).add("a")
    recorder.decision(ACME, 1, None, Decision(True))
    stats.record(ACME, Decision(True))
    assert eventually(lambda: len(recorder.log) == 1 and buffer.written == ["a"] and not stats._buffer)
    assert [t for t in threading.enumerate() if t.name == "flusher"] == [FLUSHER.thread]
    for flushable in (recorder, stats, buffer):
        flushable.close()


def test_the_thread_wakes_when_asked_and_a_broken_flush_does_not_end_it():
    flusher = Flusher()

    class Broken(Buffer):
        def flush(self):
            raise RuntimeError("a bug")

    broken = Broken(flush_every=0.01, flusher=flusher)
    buffer = Buffer(flush_every=3600, flusher=flusher).add("a")
    flusher.start()
    flusher.wake()
    assert eventually(lambda: buffer.written == ["a"])
    buffer.add("b")
    flusher.wake()
    assert eventually(lambda: buffer.written == ["a", "b"])
    assert flusher.thread.is_alive()
    broken.flush_every = None  # off the schedule (its close() would flush, which raises)


def test_a_recorder_half_full_wakes_the_flusher():
    recorder = DecisionRecorder(limit=10, flush_every=3600)
    for _ in range(5):
        recorder.decision(ACME, 1, None, Decision(True))
    assert eventually(lambda: len(recorder.log) >= 5)
    recorder.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_has_its_own_thread_and_never_writes_its_parents_buffer(redis_url):
    client = redis.Redis.from_url(redis_url)
    recorder = DecisionRecorder(client=client, flush_every=3600)
    recorder.decision({"team": "parent"}, 1, None, Decision(True))  # buffered when it forks
    timed = Buffer(flush_every=0.02)  # on the schedule the child inherits
    parent_thread = FLUSHER.thread.native_id
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (runs in the child)
        inherited = FLUSHER.thread is not None
        recorder.decision({"team": "child"}, 1, None, Decision(True))
        own = FLUSHER.thread is not None and FLUSHER.thread.is_alive() and FLUSHER.thread.native_id != parent_thread
        timed.add("c")
        by_itself = eventually(lambda: timed.written == ["c"])  # the child's thread keeps the schedule
        os.write(writing, f"{inherited} {own} {by_itself} {recorder.flush()}".encode())
        os._exit(0)
    os.close(writing)
    os.waitpid(child, 0)
    with os.fdopen(reading) as pipe:
        assert pipe.read() == "False True True 1"  # not inherited; its own, on time; its one record alone
    assert sorted(r.keys["team"] for r in recorder.records(0, 2**40)) == ["child", "parent"]
    recorder.close()
    timed.close()


# --- what a store error does -----------------------------------------------------------------


def test_drop_counts_what_the_store_refused_in_lost_and_never_writes_it(flusher):
    buffer = Buffer(DROP, flusher=flusher, fail=StoreUnavailable("down")).add("a", "b")
    assert buffer.flush() == 0
    assert (buffer.lost, buffer.items) == (2, [])
    buffer.fail = None
    assert buffer.add("c").flush() == 1 and buffer.written == ["c"]


def test_keep_sends_what_the_store_refused_with_the_next_flush(flusher):
    buffer = Buffer(KEEP, flusher=flusher, fail=RedisConnectionError("down")).add("a")
    assert buffer.flush() == 0
    buffer.add("b")
    assert buffer.flush() == 0 and buffer.items == ["a", "b"]
    buffer.fail = None
    assert buffer.flush() == 2 and buffer.written == ["a", "b"] and buffer.lost == 0


def test_an_outage_is_told_once_and_its_end_once(flusher, caplog):
    buffer = Buffer(DROP, flusher=flusher, fail=StoreUnavailable("down"))
    with caplog.at_level(logging.WARNING, logger="core.flusher"):
        for _ in range(3):
            buffer.add("a").flush()
        buffer.fail = None
        buffer.add("b").flush()
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2
    assert "unreachable" in messages[0] and "dropped" in messages[0]
    assert "back (3 lost in all)" in messages[1]


def test_a_bug_in_a_write_is_logged_and_the_batch_goes_by_the_policy(flusher, caplog):
    buffer = Buffer(KEEP, flusher=flusher, fail=KeyError("oops")).add("a")
    assert buffer.flush() == 0
    assert buffer.items == ["a"] and "flush failed (a bug)" in caplog.text
