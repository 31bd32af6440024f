"""A serving process's heap, frozen once it is warm, so that the garbage collector's full
collections stop stalling requests.

    application = FreezeWhenWarm(application, after=settings.LIMITER_GC_FREEZE_AFTER)

CPython's full collection walks every container object the collector tracks, while holding the
GIL. A warm worker tracks about 145,000 of them (Django, the URLconf and its views, the
policy's plans), nearly all for the whole of its life, and under load a full collection came
every few seconds: 60 to 100 ms of CPU, and 150 to 530 ms of wall time on a busy 2-core
machine, during which no thread of the worker ran. Those stalls were the closed-loop p99 of
issue 22 (docs/BENCHMARKS.md).

`gc.freeze()` (the `gc` module's documented call) moves every object tracked at that moment to
a permanent generation that collections skip. Half of a warm worker's objects exist once
Django is set up; the other half arrive with the first requests (the URLconf, the views,
the policy built from the database). So the freeze comes after the first `after` requests,
once, in each process (every server here imports its application in the worker, after the
fork). Frozen objects are still freed when nothing refers to them; only a reference cycle
among them would stay, and the one such set is what the requests in flight at that moment
held.

after=0 never freezes (LIMITER_GC_FREEZE_AFTER=0).
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Callable, Iterable
from typing import Any


class FreezeWhenWarm:
    """WSGI middleware: `gc.freeze()` once, when the `after`-th request arrives."""

    def __init__(self, application: Callable[..., Iterable[bytes]], after: int) -> None:
        self.application = application
        self.after = after
        self.warm = after <= 0  # nothing left to do (frozen, or never)
        # next() on a count is one C call: atomic under the GIL, so that threads never skip the
        # request that freezes.
        self._seen = itertools.count(1)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if not self.warm and next(self._seen) >= self.after:
            self.warm = True
            gc.freeze()
        return self.application(environ, start_response)
