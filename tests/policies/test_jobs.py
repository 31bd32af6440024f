"""Bounded background work (policies/services/jobs.py): a pool that says busy rather than
start another thread, and a job in a process of its own, stopped when its time is up."""

import os
import threading

import pytest

from policies.services.errors import Busy
from policies.services.jobs import ChildFailed, JobPool, TimedOut, in_child


def test_a_full_pool_says_busy_at_once_and_takes_work_again_once_one_ends():
    pool = JobPool("test", workers=1, waiting=2, retry_after=3)
    release = threading.Event()
    running = [pool.submit(release.wait, 10) for _ in range(3)]  # one running, two waiting
    assert pool.held == 3
    with pytest.raises(Busy) as busy:
        pool.submit(release.wait, 10)
    assert busy.value.retry_after == 3 and "3 test jobs are running or waiting" in busy.value.reason
    release.set()
    assert all(job.result(10) for job in running)
    assert pool.submit(lambda: 7).result(10) == 7
    pool.shutdown()


def test_a_forked_child_starts_with_an_empty_pool_of_its_own():
    pool = JobPool("test", workers=1, waiting=0)
    release = threading.Event()
    held = pool.submit(release.wait, 10)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's job is not its own
        try:
            answer = b"%d" % pool.submit(lambda: 5).result(10)
        except BaseException as error:  # noqa: BLE001  (told to the parent, whatever it is)
            answer = repr(error).encode()
        os.write(write, answer)
        os._exit(0)
    os.close(write)
    told = os.read(read, 200)
    os.waitpid(pid, 0)
    release.set()
    held.result(10)
    assert told == b"5"


def test_a_job_in_a_child_answers_and_reports_progress():
    heard = []
    answer = in_child("tests.policies.child_jobs", ("count", 3), seconds=30, progress=lambda *p: heard.append(p))
    assert answer["counted"] == 3 and answer["pid"] != os.getpid()
    assert heard == [(1, 3), (2, 3), (3, 3)]


def test_a_job_past_its_time_is_stopped_and_its_process_gone():
    if os.path.exists(child_pid_file()):
        os.remove(child_pid_file())
    # 5 s: time enough for the child to start and write its pid on a busy machine.
    with pytest.raises(TimedOut, match="longer than the 5 s"):
        in_child("tests.policies.child_jobs", ("sleep", 60), seconds=5)
    # The child wrote its pid before sleeping; it is gone.
    with open(child_pid_file()) as found:
        pid = int(found.read())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_job_that_fails_in_its_child_says_why():
    with pytest.raises(ChildFailed, match="ZeroDivisionError"):
        in_child("tests.policies.child_jobs", ("divide", 0), seconds=30)


def test_a_child_that_dies_without_answering_is_a_failure_not_a_wait():
    with pytest.raises(ChildFailed, match="ended without an answer"):
        in_child("tests.policies.child_jobs", ("exit", 3), seconds=30)


def child_pid_file() -> str:
    from tests.policies.child_jobs import PID_FILE

    return PID_FILE
