"""Processes that decide at the same moment on one Redis, for the exactness tests.

    allowed = decide_from_processes(url, config, keys, processes=4, threads=50)

Each process builds its own limiter on its own RedisStore (its own connections), starts
`threads` threads that each wait on a barrier, and once every process is ready, lets them
all ask for one request at once. The parent gets back every answer. Processes are spawned,
not forked: nothing of the parent's (connections, locks) leaks into them.
"""

from __future__ import annotations

import multiprocessing
import threading

# Patient on purpose: 200 threads on two cores may wait their turn longer than the 50 ms a
# decision gets in production, and these tests are about counting, not timeouts.
TIMEOUT = 5.0
READY_WITHIN = 60.0


def decide_from_processes(
    url: str, config: dict, keys: dict, processes: int = 4, threads: int = 50, prefix: str = "la"
) -> list[tuple[bool, bool]]:
    """(allowed, degraded) of every one of `processes` x `threads` simultaneous requests."""
    found = decide_spread(url, config, [keys], processes, threads, prefix)
    return [(allowed, degraded) for allowed, degraded, _ in found]


def decide_spread(
    url: str,
    config: dict,
    key_sets: list[dict],
    processes: int = 4,
    threads: int = 50,
    prefix: str = "la",
    each: int = 1,
    options: dict | None = None,
) -> list[tuple[bool, bool, int]]:
    """(allowed, degraded, which key set) of `processes` x `threads` simultaneous threads,
    each making `each` requests, request n of the whole run on key_sets[n % len(key_sets)].
    `url` may be redis:// or redis-cluster://; `options` go to the store."""
    context = multiprocessing.get_context("spawn")
    ready = context.Barrier(processes)
    answers = context.Queue()
    children = [
        context.Process(
            target=_decide, args=(url, config, key_sets, threads, prefix, ready, answers, p, each, options or {})
        )
        for p in range(processes)
    ]
    for child in children:
        child.start()
    try:
        found = [answers.get(timeout=READY_WITHIN + 30) for _ in children]
    finally:
        for child in children:
            child.join(10)
            if child.is_alive():
                child.kill()
    errors = [item for item in found if isinstance(item, str)]
    assert not errors, errors[0]
    return [answer for batch in found for answer in batch]


def _decide(url, config, key_sets, threads, prefix, ready, answers, process, each, options) -> None:
    try:
        from core import HierarchicalLimiter
        from core.stores import store_from_url

        store = store_from_url(url, prefix=prefix, timeout=TIMEOUT, **options)
        limiter = HierarchicalLimiter.from_config(config, store=store)
        store.ping()  # connected before the start, so the start is the decisions alone
        start = threading.Barrier(threads + 1)
        found: list = []

        def one(k: int) -> None:
            start.wait(READY_WITHIN)
            for n in range(each):
                which = ((process * threads + k) * each + n) % len(key_sets)
                decision = limiter.acquire(key_sets[which])
                found.append((decision.allowed, decision.degraded, which))

        workers = [threading.Thread(target=one, args=(k,)) for k in range(threads)]
        for worker in workers:
            worker.start()
        ready.wait(READY_WITHIN)  # every process has its threads waiting
        start.wait(READY_WITHIN)
        for worker in workers:
            worker.join(READY_WITHIN)
        answers.put(found)
    except BaseException as error:  # the parent reports it, rather than waiting for nothing
        answers.put(f"{type(error).__name__}: {error}")


def settle_from_processes(
    url: str,
    config: dict,
    keys: dict,
    processes: int = 4,
    threads: int = 25,
    estimate: float = 4.0,
    actuals: tuple[float, ...] = (2.0, 6.0),
    top_up: tuple[str, int | str, float] | None = None,
    options: dict | None = None,
) -> dict[str, float]:
    """A quota spent from `processes` x `threads` threads at one key set, in three phases, each
    begun at once everywhere: every thread reserves `estimate`; every thread that got a
    reservation settles it with actuals[n % len(actuals)] (n: the thread's number over all
    processes), so above and below its estimate; then every thread spends 1, and, with
    `top_up` = (level, rule, amount), every even thread tops up `amount` first.
    Returns the totals: reserved, charged (the actual costs settled), spent, topped_up."""
    context = multiprocessing.get_context("spawn")
    phase = context.Barrier(processes)
    answers = context.Queue()
    children = [
        context.Process(
            target=_reserve_and_settle,
            args=(url, config, keys, threads, phase, answers, p, estimate, actuals, top_up, options or {}),
        )
        for p in range(processes)
    ]
    for child in children:
        child.start()
    try:
        found = [answers.get(timeout=READY_WITHIN + 60) for _ in children]
    finally:
        for child in children:
            child.join(10)
            if child.is_alive():
                child.kill()
    errors = [item for item in found if isinstance(item, str)]
    assert not errors, errors[0]
    return {name: sum(totals[name] for totals in found) for name in found[0]}


def _reserve_and_settle(url, config, keys, threads, phase, answers, process, estimate, actuals, top_up, options):
    try:
        from core import HierarchicalLimiter
        from core.stores import store_from_url

        store = store_from_url(url, timeout=TIMEOUT, **options)
        limiter = HierarchicalLimiter.from_config(config, store=store)
        store.ping()
        totals = {"reserved": 0, "charged": 0.0, "spent": 0, "topped_up": 0.0}
        held: dict[int, object] = {}
        lock = threading.Lock()

        def reserve(k: int) -> None:
            decision, reservation = limiter.reserve(keys, estimate, hold=600)
            assert not decision.degraded, decision
            if reservation is not None:
                with lock:
                    held[k] = reservation
                    totals["reserved"] += 1

        def settle(k: int) -> None:
            reservation = held.get(k)
            if reservation is not None:
                actual = actuals[(process * threads + k) % len(actuals)]
                limiter.settle(reservation.id, actual)
                with lock:
                    totals["charged"] += actual

        def spend(k: int) -> None:
            if top_up is not None and k % 2 == 0:
                level, rule, amount = top_up
                limiter.top_up(level, keys[level], rule, amount)
                with lock:
                    totals["topped_up"] += amount
            decision = limiter.acquire(keys)
            assert not decision.degraded, decision
            with lock:
                totals["spent"] += decision.allowed

        failures: list[BaseException] = []
        for work in (reserve, settle, spend):
            phase.wait(READY_WITHIN)  # every process starts the phase together
            start = threading.Barrier(threads)

            def run(k: int, work=work, start=start) -> None:
                start.wait(READY_WITHIN)
                try:
                    work(k)
                except BaseException as failure:  # reported by the process, below
                    failures.append(failure)

            workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join(READY_WITHIN)
            if failures:
                raise failures[0]
        answers.put(totals)
    except BaseException as error:  # the parent reports it, rather than waiting for nothing
        answers.put(f"{type(error).__name__}: {error}")
