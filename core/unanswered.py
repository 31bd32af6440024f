"""Reservations whose answer was lost: cancelled once the store answers again.

A reservation's store call can fail after the store has made it: Redis ran the script, and
its reply came later than the store's timeout (a busy host, a congested link). The caller then
has the level's fail mode for an answer and no id to settle, while the store holds the
estimate; when the hold runs out the estimate stays spent (docs/API.md), so a budget that
never refills would have lost it for good. The limiter hands each such id here, and the
process's flushing thread cancels it:

    unanswered = Unanswered(lambda rid: limiter.settle(rid, None))
    unanswered.add(reservation.id, hold)      # the store call raised StoreUnavailable

A cancel that the store refuses (it is still down) is tried again at the next flush. One that
finds no reservation is tried again for LATE_ANSWER seconds (the command may still be in a
socket or the server's queue), then dropped: the store never made it. One whose hold has run
out is dropped untried: the store answers it with "unknown or expired" and gives nothing back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .errors import ReservationNotFound, ReservationSettled
from .flusher import KEEP, Flushable, Flusher

log = logging.getLogger(__name__)

# Seconds after its call during which a reservation the store does not know may still appear.
LATE_ANSWER = 5.0
# Reservations waiting for their cancel at most; more are dropped and counted in `lost`.
MOST_WAITING = 10_000
FLUSH_EVERY = 1.0  # seconds

# A waiting reservation: (monotonic time from which "not found" is final, when its hold ends).
Waiting = dict[str, tuple[float, float]]


class Unanswered(Flushable):
    """The reservations of one limiter whose store call failed, each cancelled by `cancel(id)`
    (which raises ReservationNotFound, ReservationSettled or StoreUnavailable as
    `HierarchicalLimiter.settle` does). `clock` gives monotonic seconds."""

    on_store_error = KEEP
    what = "unanswered reservations"

    def __init__(
        self,
        cancel: Callable[[str], object],
        clock: Callable[[], float] = time.monotonic,
        flush_every: float | None = FLUSH_EVERY,
        flusher: Flusher | None = None,
    ) -> None:
        self.cancel, self.clock = cancel, clock
        self.cancelled = 0  # reservations this process gave back after their answer was lost
        self._lock = threading.Lock()
        self._waiting: Waiting = {}
        super().__init__(flush_every, flusher)

    def add(self, reservation_id: str, hold: float) -> None:
        """Cancel `reservation_id`, made for `hold` seconds, once the store answers."""
        now = self.clock()
        with self._lock:
            if len(self._waiting) >= MOST_WAITING:
                self.lost += 1
                return
            self._waiting[reservation_id] = (now + LATE_ANSWER, now + hold)
        self.flusher.start()

    def __len__(self) -> int:
        return len(self._waiting)

    def take(self) -> Waiting | None:
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        return waiting or None

    def keep(self, batch: Waiting) -> None:
        with self._lock:
            for reservation_id, times in batch.items():
                if len(self._waiting) >= MOST_WAITING:
                    self.lost += 1
                else:
                    self._waiting.setdefault(reservation_id, times)

    def write(self, batch: Waiting) -> int:
        """Cancel what is in `batch`, taking each out as it is done with; a store error passes
        through with the rest still in it (the flusher keeps it). How many were cancelled."""
        now, again, cancelled = self.clock(), {}, 0
        try:
            for reservation_id, (final_from, hold_ends) in list(batch.items()):
                if now < hold_ends:
                    try:
                        self.cancel(reservation_id)
                        cancelled += 1
                    except ReservationSettled:
                        pass  # cancelled here before, its answer lost in turn
                    except ReservationNotFound:
                        if now < final_from:
                            again[reservation_id] = (final_from, hold_ends)
                del batch[reservation_id]
        finally:
            self.keep(again)
            if cancelled:
                self.cancelled += cancelled
                log.warning("cancelled %d reservation(s) that the store made but whose answer was lost", cancelled)
        return cancelled

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        self._waiting = {}  # the parent's, which the parent cancels
        super().after_fork()
