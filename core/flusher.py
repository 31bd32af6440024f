"""One background thread per process that writes out what the recorder and the statistics buffer.

    class Log(Flushable):                 # take() and write(batch), and keep(batch) for KEEP
        on_store_error = DROP
    log = Log(flush_every=1.0)            # registered with FLUSHER, held weakly
    FLUSHER.wake()                        # flush every registered buffer now (one grew large)

The decision recorder and the denial statistics buffer in process, off the decision's path,
and one daemon thread writes the buffers out. It is started on first use (a record path calls
`start()`) and made again in a forked child, never inherited: a child writes its own buffers,
never its parent's, which the parent writes. It sleeps until the earliest flushable is due (each
every `flush_every` seconds) or until it is woken, then flushes what is due: a heap pop and a
`flush()` each, and nothing else.

What a store error does to a buffer is decided here, once, by each flushable's `on_store_error`:

    DROP  what could not be written is dropped and counted in `lost`: the recorder's records
          (decisions never wait for them; a replay does without an outage's records)
    KEEP  it is handed back to the flushable's `keep()`, which bounds it, and goes out with the
          next flush: the statistics' counts (an outage's denials are what an operator wants
          to see afterwards)

Any other exception is a bug: it is logged with its traceback, the batch goes the same way, and
the thread goes on.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

from redis.exceptions import RedisError

from .errors import StoreUnavailable

log = logging.getLogger(__name__)

# What a flush counts as the store failing, rather than a bug: our own StoreUnavailable, and
# the driver's errors (a flushable's writer may pass them through).
STORE_ERRORS: tuple[type[Exception], ...] = (StoreUnavailable, RedisError, OSError)


class OnStoreError(enum.Enum):
    """What a flush that the store refused does with its batch (see the module's docstring)."""

    DROP = "dropped and counted in `lost`"
    KEEP = "kept for the next flush"


DROP, KEEP = OnStoreError.DROP, OnStoreError.KEEP


class Flushable:
    """A buffer in this process that the flusher writes out every `flush_every` seconds (None:
    only when flushed by hand). Required: `take` and `write`; `keep` with KEEP. `flush` and
    `close` are built from them; `after_fork` is extended by a subclass that holds a buffer."""

    on_store_error: ClassVar[OnStoreError]
    what: ClassVar[str] = "buffer"  # what the log lines call it

    def __init__(self, flush_every: float | None, flusher: Flusher | None = None) -> None:
        self.flush_every = flush_every
        self.lost = 0  # items a failed flush dropped (DROP)
        self.store_failing = False  # the last flush failed: told once, and again when it is back
        self.flusher = flusher if flusher is not None else FLUSHER
        self.flush_lock = threading.Lock()  # one flush at a time
        self.flusher.register(self)

    def take(self) -> Any:
        """Detach what is buffered, as one batch with a len(); None when there is nothing."""
        raise NotImplementedError(f"{type(self).__name__} must implement take()")

    def write(self, batch: Any) -> int:
        """Write `batch` out; how many items went. The store's errors pass through."""
        raise NotImplementedError(f"{type(self).__name__} must implement write()")

    def keep(self, batch: Any) -> None:
        """KEEP: hold `batch` for the next take(), bounded."""
        raise NotImplementedError(f"{type(self).__name__} must implement keep() to keep what a flush could not write")

    def after_fork(self) -> None:
        """In a forked child: forget the parent's buffer (the parent writes it out) and make new
        locks (one held at the fork would never open)."""
        self.flush_lock = threading.Lock()

    def flush(self) -> int:
        """Write out what is buffered; how many items went. Never raises: a failure goes by
        `on_store_error`."""
        return flush(self)

    def close(self) -> None:
        """No more flushes by the thread; write out what is left."""
        self.flush_every = None
        self.flush()


def flush(flushable: Flushable) -> int:
    """`flushable.flush()`: take its batch and write it; a store error, or a bug, hands the
    batch to its policy. Never raises."""
    with flushable.flush_lock:
        batch = None
        try:
            batch = flushable.take()
            if batch is None:
                return 0
            written = flushable.write(batch)
        except STORE_ERRORS as error:
            _failed(flushable, batch, error)
            return 0
        except Exception as error:
            log.exception(
                "%s: flush failed (a bug); what it held is %s", flushable.what, flushable.on_store_error.value
            )
            _failed(flushable, batch, error)
            return 0
        if flushable.store_failing:
            flushable.store_failing = False
            lost = f" ({flushable.lost} lost in all)" if flushable.on_store_error is DROP else ""
            log.warning("%s: the store is back%s", flushable.what, lost)
        return written


def _failed(flushable: Flushable, batch: Any, error: Exception) -> None:
    """The one place that says what a failed flush does to its batch."""
    if batch is not None:
        if flushable.on_store_error is DROP:
            flushable.lost += len(batch)
        else:
            flushable.keep(batch)
    if isinstance(error, STORE_ERRORS) and not flushable.store_failing:
        flushable.store_failing = True
        what, policy = flushable.what, flushable.on_store_error.value
        log.warning("%s: the store is unreachable, what it cannot take is %s: %s", what, policy, error)


class Flusher:
    """The flushing thread of a process, and its schedule of flushables held weakly.

    `clock` gives monotonic seconds; the thread waits in real seconds, so a test that moves a
    clock by hand calls `flush_due()` itself rather than starting the thread."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._order = itertools.count()  # breaks ties in the heap: weakrefs do not compare
        self._due: list[tuple[float, int, weakref.ref[Flushable]]] = []
        self._tracked: weakref.WeakSet[Flushable] = weakref.WeakSet()  # timed or not: told of a fork
        # Told the CPU seconds each scheduled flush took in this thread, by its flushable's `what`
        # (policies.telemetry counts them in /metrics: the flushes' share of a worker's CPU).
        self.on_flushed: Callable[[str, float], None] | None = None
        self._afresh()

    def _afresh(self) -> None:
        """No thread, new lock and event: at start and in a forked child."""
        self.thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._woken = threading.Event()
        self._everything = False  # the next wake flushes every flushable, due or not

    def register(self, flushable: Flushable) -> None:
        """Know `flushable` (weakly); flush it every `flush_every` seconds when it has one."""
        self._tracked.add(flushable)
        if flushable.flush_every:
            with self._lock:
                heapq.heappush(
                    self._due, (self.clock() + flushable.flush_every, next(self._order), weakref.ref(flushable))
                )
            self._woken.set()  # it may be due before the thread's next wake: the thread looks again

    def forget(self, flushable: Flushable) -> None:
        """No more timed flushes of `flushable` (it is still flushed by hand)."""
        with self._lock:
            self._due = [entry for entry in self._due if entry[2]() is not flushable]
            heapq.heapify(self._due)

    def __len__(self) -> int:
        """How many flushables are on the schedule (a dropped one until its turn comes)."""
        return len(self._due)

    def start(self) -> None:
        """Start this process's thread, unless it runs already."""
        with self._lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="flusher", daemon=True)
                self.thread.start()

    def wake(self) -> None:
        """Flush every scheduled flushable now (a buffer grew large), in the thread."""
        self._everything = True
        self._woken.set()

    def flush_due(self, everything: bool = False) -> float | None:
        """Flush the flushables that are due (all of them with `everything`) and schedule each
        again; a dropped one is let go. Returns when the next is due (None: none is)."""
        now = self.clock()
        with self._lock:
            due = []
            while self._due and (everything or self._due[0][0] <= now):
                due.append(heapq.heappop(self._due)[2])
        again = []
        for ref in due:
            flushable = ref()
            if flushable is None:
                continue
            started = time.thread_time()
            try:
                flushable.flush()
            except Exception:  # flush() never raises; an override might, and must not stop the others
                log.exception("flusher: flushing %s failed", flushable.what)
            if self.on_flushed is not None:
                self.on_flushed(flushable.what, time.thread_time() - started)
            if flushable.flush_every:
                again.append((now + flushable.flush_every, next(self._order), ref))
            del flushable
        with self._lock:
            for entry in again:
                heapq.heappush(self._due, entry)
            return self._due[0][0] if self._due else None

    def _run(self) -> None:
        # At once to the schedule: a forked child's thread starts on flushables already due.
        woken = self._woken
        next_due: float | None = self.clock()
        while True:
            woken.wait(None if next_due is None else max(0.0, next_due - self.clock()))
            woken.clear()
            everything, self._everything = self._everything, False
            try:
                next_due = self.flush_due(everything)
            except Exception:  # a bug here must not leave the process without its flushes
                log.exception("flusher: a round failed")

    def after_fork_in_child(self) -> None:
        """The child's own thread, started on first use; its flushables forget the parent's
        buffers."""
        self._afresh()
        for flushable in list(self._tracked):
            flushable.after_fork()


# The flusher of this process.
FLUSHER = Flusher()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=FLUSHER.after_fork_in_child)
