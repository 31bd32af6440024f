"""Bounded background work for a web worker: a few threads, a short queue, "busy" past it,
and the heavy part in a process of its own with a time cap.

    replays = JobPool("whatif", workers=1, waiting=4)
    future = replays.submit(replay, draft)        # Busy when 1 runs and 4 wait already
    result = in_child("policies.replay_child", job, seconds=60, progress=told)

A request that would start heavy work (a what-if replay) hands it to a pool rather than
running it in its own thread or starting a new one: at most `workers` jobs run at once in
this process, at most `waiting` more wait, and one more is refused at once with Busy (the
transports answer "busy, try again"), so no number of clicks can take every thread of a
worker. The threads are made on first use, and made again in a forked child (gunicorn
forks its workers), whose copy of the parent's pool has no threads.
"""

from __future__ import annotations

import os
import pickle
import selectors
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from core import StoreUnavailable

from ..replay_child import FrameReader
from .errors import Busy, ServiceError

# Where `python -m policies...` finds the project.
PROJECT = Path(__file__).resolve().parent.parent.parent

_pools: weakref.WeakSet[JobPool] = weakref.WeakSet()


class JobPool:
    """At most `workers` jobs running and `waiting` queued; `retry_after` is what Busy says."""

    def __init__(self, name: str, workers: int = 1, waiting: int = 4, retry_after: float = 5.0) -> None:
        if workers < 1 or waiting < 0:
            raise ValueError(f"a pool needs 1 worker or more and 0 waiting or more, got {workers} and {waiting}")
        self.name, self.workers, self.waiting, self.retry_after = name, workers, waiting, retry_after
        self._start_afresh()
        _pools.add(self)

    def _start_afresh(self) -> None:
        # A forked child starts with no threads and no jobs: its parent's belong to the parent.
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._held = 0  # jobs running or waiting

    @property
    def held(self) -> int:
        """Jobs running or waiting now."""
        return self._held

    def submit(self, job: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        """Queue `job(*args, **kwargs)`; its Future. Busy when the pool is full."""
        with self._lock:
            if self._held >= self.workers + self.waiting:
                raise Busy(
                    f"{self._held} {self.name} jobs are running or waiting, the most this worker takes; try again",
                    self.retry_after,
                )
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix=f"{self.name}-job")
            self._held += 1
            executor = self._executor
        try:
            future = executor.submit(job, *args, **kwargs)
        except BaseException:
            self._done()
            raise
        future.add_done_callback(lambda _: self._done())
        return future

    def _done(self) -> None:
        with self._lock:
            self._held -= 1

    def shutdown(self) -> None:
        """Let the running jobs finish, drop the waiting ones; the pool starts again on use."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


class ChildFailed(ServiceError):
    """The job's process failed (a bug there), or ran out of its time and was stopped."""

    code = "job_failed"


class TimedOut(ChildFailed):
    """The job's process ran past its time and was stopped."""

    code = "timed_out"


def in_child(module: str, job: Any, seconds: float, progress: Callable[[int, int], None] | None = None) -> Any:
    """Run `python -m <module>` on `job` (pickled to its standard input) and give back what it
    answers, hearing its progress on the way (policies/replay_child.py states the frames).
    Stopped after `seconds` (TimedOut). StoreUnavailable when the process could not read the
    store; ChildFailed when it failed otherwise."""
    child = subprocess.Popen(
        [sys.executable, "-m", module],
        cwd=PROJECT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + seconds
    assert child.stdin is not None and child.stdout is not None
    try:
        with child.stdin:
            pickle.dump(job, child.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        for kind, *rest in _frames(child.stdout, deadline, seconds):
            if kind == "progress":
                if progress is not None:
                    progress(*rest)
            elif kind == "done":
                return rest[0]
            elif kind == "unavailable":
                raise StoreUnavailable(rest[0])
            else:
                raise ChildFailed(f"the job failed: {rest[0]}")
        raise ChildFailed(f"the job's process ended without an answer (exit {child.wait(5)})")
    except BrokenPipeError:
        raise ChildFailed("the job's process ended before it read its job") from None
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()


def _frames(source: Any, deadline: float, seconds: float) -> Iterator[Any]:
    """The frames the child writes, read in this thread as they arrive (no reader thread),
    until its output ends; TimedOut past `deadline`."""
    reader = FrameReader()
    with selectors.DefaultSelector() as selector:
        selector.register(source, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise TimedOut(f"the job took longer than the {seconds:g} s it may take, and was stopped")
            data = os.read(source.fileno(), 65536)
            if not data:  # the end of its output (a child killed mid-frame leaves a part unread)
                return
            yield from reader.feed(data)


def _after_fork_in_child() -> None:
    for pool in list(_pools):
        pool._start_afresh()


os.register_at_fork(after_in_child=_after_fork_in_child)
