"""Fail modes: while Redis cannot be reached, each level does what its fail mode says
(open allows, closed denies, local decides in process at a fraction of its limits), every
call comes back within the store's timeout, no exception reaches the caller, and once Redis
is back the decisions are made on Redis again within a second.

Redis is made unreachable for real: a redis-server of the test's own is killed (SIGKILL) or
frozen (SIGSTOP: it accepts connections and never answers), or the store points at a port
where nothing listens. These tests read the wall clock, because timeouts are what they
check; sleeping here only paces a stream or polls, it never aims at an edge. A bound on a
call's time allows for the stalls that a metronome thread measured over the same interval
(`Stalls`): on a busy 2-core machine a garbage collection or another process can hold this
one up for half a second, and that is not the store's doing.
"""

import contextlib
import gc
import statistics
import threading
import time

import pytest
import redis

from core import HierarchicalLimiter
from core.stores.redis import DEFAULT_TIMEOUT, CircuitBreaker, RedisStore

from .helpers import concurrency, token_bucket

CONFIG = {
    "user": [token_bucket(100, 0), concurrency(50)],  # a lease: the limiter's slower path
    "team": [token_bucket(100, 0)],
    "global": [token_bucket(8, 0)],
}
FAIL_MODES = {"user": "open", "team": "closed", "global": {"fail_mode": "local", "fallback_fraction": 0.25}}
USER, TEAM, GLOBAL = {"user": "u"}, {"team": "t"}, {"global": "*"}
EVERY_LEVEL = {**USER, **TEAM, **GLOBAL}
# The most a call may take while Redis is down, stalls of the whole process aside: the store's
# timeout (a frozen Redis makes a call wait for it once), plus the call's own work on a busy
# machine, with room to spare.
LONGEST_CALL = DEFAULT_TIMEOUT + 0.2


def limiter_on(url):
    return HierarchicalLimiter.from_config(CONFIG, store=RedisStore(url=url, prefix="fail"), fail_modes=FAIL_MODES)


class Stalls:
    """A metronome in a thread of its own that notes how late each of its ticks woke. What
    holds the whole process up (a garbage collection, the CPU given to other processes) holds
    the metronome up as well; a call waiting on a socket does not. So the lateness of the ticks
    over a call's interval is the part of its time that was not the call's doing."""

    TICK = 0.002

    def __init__(self):
        self.ticks = []  # (asked to sleep at, woke at), by time.perf_counter
        self.asleep_since = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            self.asleep_since = asked = time.perf_counter()
            time.sleep(self.TICK)
            self.ticks.append((asked, time.perf_counter()))
        self.asleep_since = None

    def stop(self):
        """Stop ticking; every tick that overlaps a call made before this is noted."""
        self._stop.set()
        self._thread.join()

    def during(self, start, end):
        """Seconds of stall measured between `start` and `end` (time.perf_counter), the tick
        still asleep included: a stall may not have let the metronome note its end yet."""
        stalled = sum(woke - asked - self.TICK for asked, woke in list(self.ticks) if asked < end and woke > start)
        asleep_since = self.asleep_since
        if asleep_since is not None and asleep_since < end:
            stalled += max(0.0, min(end, time.perf_counter()) - asleep_since - self.TICK)
        return stalled

    def own_time(self, start, end):
        """How long a call from `start` to `end` took, less the stalls of the process."""
        return max(0.0, end - start - self.during(start, end))


@pytest.fixture
def stalls():
    metronome = Stalls()
    yield metronome
    metronome.stop()


def timed(call, *args, **kwargs):
    """The call's result, and when it started and ended (time.perf_counter)."""
    started = time.perf_counter()
    result = call(*args, **kwargs)
    return result, (started, time.perf_counter())


def wait_until_decided_on_redis(limiter, keys, within, stalls):
    """Poll until a decision is no longer degraded, for at most `within` seconds plus the
    stalls meanwhile; returns how long that took, less those stalls."""
    started = time.perf_counter()
    while limiter.acquire(keys).degraded:
        waited = stalls.own_time(started, time.perf_counter())
        assert waited < within, f"still degraded after {within} s"
        time.sleep(0.005)
    return stalls.own_time(started, time.perf_counter())


def limiter_after(request, outage):
    """A limiter whose Redis has gone: killed or frozen after the limiter had used it (so
    it holds a connection and the server had its script), or never there at all."""
    if outage == "nothing listening":
        return limiter_on(request.getfixturevalue("unreachable_redis_url"))
    server = request.getfixturevalue("disposable_redis")
    limiter = limiter_on(server.url)
    assert not limiter.acquire(EVERY_LEVEL).degraded
    if outage == "killed":
        server.kill()
    else:
        server.freeze()
    return limiter


@pytest.fixture(params=["killed", "nothing listening"])
def limiter_without_redis(request):
    return limiter_after(request, request.param)


@pytest.fixture(params=["killed", "frozen", "nothing listening"])
def limiter_while_redis_is_down(request):
    """Also a server that is there but never answers: the outage that costs timeouts."""
    return limiter_after(request, request.param)


# --- each level's fail mode -----------------------------------------------------------------


def test_an_open_level_lets_requests_through_and_says_degraded(limiter_without_redis):
    decisions = [limiter_without_redis.acquire(USER) for _ in range(3)]
    assert all(d.allowed and d.degraded and d.reason == "OK" for d in decisions)


def test_a_closed_level_denies_with_store_unavailable(limiter_without_redis):
    denied = limiter_without_redis.acquire(TEAM)
    assert not denied.allowed
    assert denied.degraded
    assert denied.reason == "STORE_UNAVAILABLE"
    assert denied.blocked_by.startswith("team")
    assert denied.retry_after > 0


def test_a_local_level_allows_exactly_its_fallback_fraction_of_the_limit(limiter_without_redis):
    # A bucket of 8 at a fallback fraction of 0.25: 2 in this process while Redis is down.
    decisions = [limiter_without_redis.acquire(GLOBAL) for _ in range(6)]
    assert [d.allowed for d in decisions] == [True, True, False, False, False, False]
    assert all(d.degraded for d in decisions)


def test_a_closed_level_denies_a_request_that_spans_every_level(limiter_without_redis):
    decision = limiter_without_redis.acquire(EVERY_LEVEL)
    assert (decision.allowed, decision.reason, decision.degraded) == (False, "STORE_UNAVAILABLE", True)


def test_beside_an_open_level_a_local_level_decides(limiter_without_redis):
    decisions = [limiter_without_redis.acquire({**USER, **GLOBAL}) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, False, False]
    assert all(d.degraded for d in decisions)


def test_a_release_while_redis_is_down_gives_nothing_back_and_raises_nothing(limiter_without_redis):
    held = limiter_without_redis.acquire(USER)
    assert held.allowed and held.degraded
    assert limiter_without_redis.release(USER, held.lease or "a-lease") == 0


# --- no call waits long ---------------------------------------------------------------------


@pytest.mark.slow
def test_no_call_takes_longer_than_the_timeout_while_redis_is_down(limiter_while_redis_is_down, stalls):
    calls = []
    stop = time.monotonic() + 1.0
    while time.monotonic() < stop:
        for keys in (USER, TEAM, GLOBAL, EVERY_LEVEL):
            decision, call = timed(limiter_while_redis_is_down.acquire, keys)
            assert decision.degraded
            calls.append(call)
    stalls.stop()
    durations = [stalls.own_time(*call) for call in calls]
    assert max(durations) < LONGEST_CALL
    # The circuit breaker is open most of the time: most calls do not touch the network.
    assert statistics.median(durations) < 0.005
    slow = [took for took in durations if took >= DEFAULT_TIMEOUT * 0.8]
    assert len(slow) <= len(durations) // 20, f"{len(slow)} of {len(durations)} calls waited"


@pytest.mark.slow
def test_threads_deciding_at_once_do_not_each_pay_the_timeout_of_a_frozen_redis(disposable_redis, stalls):
    limiter = limiter_on(disposable_redis.url)
    assert not limiter.acquire(EVERY_LEVEL).degraded
    disposable_redis.freeze()
    reasons, calls, lock = [], [], threading.Lock()
    stop = time.monotonic() + 1.2

    def stream():
        while time.monotonic() < stop:
            decision, call = timed(limiter.acquire, TEAM)
            with lock:
                reasons.append(decision.reason)
                calls.append(call)
            time.sleep(0.002)

    threads = [threading.Thread(target=stream) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stalls.stop()
    durations = [stalls.own_time(*call) for call in calls]
    assert set(reasons) == {"STORE_UNAVAILABLE"}
    assert max(durations) < LONGEST_CALL
    slow = [took for took in durations if took >= DEFAULT_TIMEOUT * 0.8]
    assert len(slow) <= len(durations) // 20, f"{len(slow)} of {len(durations)} calls waited"


@pytest.mark.slow
def test_once_the_breaker_is_open_one_call_at_a_time_tries_a_frozen_redis(disposable_redis):
    # CircuitBreaker.allows: once the backoff has passed, "yes for one caller at a time (the
    # probe), so that a frozen Redis costs one timeout per backoff, not one per waiting thread".
    # A breaker that opens at the first failure, so that the calls made before it opened are
    # exactly those that started before the first of them failed.
    store = RedisStore(url=disposable_redis.url, prefix="fail", breaker=CircuitBreaker(threshold=1))
    limiter = HierarchicalLimiter.from_config(CONFIG, store=store, fail_modes=FAIL_MODES)
    assert not limiter.acquire(EVERY_LEVEL).degraded
    disposable_redis.freeze()
    waits, lock = [], threading.Lock()
    stop = time.monotonic() + 1.2

    def stream():
        while time.monotonic() < stop:
            started = time.perf_counter()
            limiter.acquire(TEAM)
            ended = time.perf_counter()
            if ended - started >= DEFAULT_TIMEOUT * 0.8:
                with lock:
                    waits.append((started, ended))
            time.sleep(0.002)

    threads = [threading.Thread(target=stream) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    waits.sort()
    opened = min(end for _, end in waits)  # until then every thread could wait at once
    probes = [wait for wait in waits if wait[0] >= opened]
    overlapping = sum(1 for (_, end), (start, _) in zip(probes, probes[1:]) if start < end)
    assert len(probes) >= 2, "the breaker never tried Redis again"
    assert overlapping == 0, f"{overlapping} of {len(probes)} probes overlapped another"


# --- Redis answers, with an error ------------------------------------------------------------


def test_a_redis_out_of_memory_gets_each_levels_fail_mode_rather_than_an_exception(disposable_redis):
    # A Redis at maxmemory refuses the script's writes: that is the store failing, so it
    # must reach the limiter as StoreUnavailable (one error type per layer), not escape.
    limiter = limiter_on(disposable_redis.url)
    assert not limiter.acquire(EVERY_LEVEL).degraded
    disposable_redis.client().config_set("maxmemory", 1)
    open_level, closed_level = limiter.acquire(USER), limiter.acquire(TEAM)
    assert (open_level.allowed, open_level.degraded) == (True, True)
    assert (closed_level.reason, closed_level.degraded) == ("STORE_UNAVAILABLE", True)


@pytest.mark.slow
def test_a_probe_that_meets_a_redis_error_does_not_keep_the_breaker_open_for_good(disposable_redis, stalls):
    limiter = limiter_on(disposable_redis.url)
    assert not limiter.acquire(TEAM).degraded
    disposable_redis.kill()
    for _ in range(5):  # enough failures to open the breaker
        assert limiter.acquire(TEAM).degraded
    disposable_redis.start()
    admin = disposable_redis.client()
    admin.config_set("maxmemory", 1)  # Redis is back, but refuses every write
    stop = time.monotonic() + 0.8  # longer than the breaker's longest backoff: it probes
    while time.monotonic() < stop:
        with contextlib.suppress(redis.RedisError):  # an escaping OOM: see the test above
            limiter.acquire(TEAM)
        time.sleep(0.005)
    admin.config_set("maxmemory", 0)  # healthy again
    assert wait_until_decided_on_redis(limiter, TEAM, within=1.0, stalls=stalls) < 1.0


# --- a stream of decisions while Redis dies and comes back ---------------------------------


def stream_decisions(limiter, stop, log, lock):
    """Decide in a loop until `stop` (time.perf_counter), each request at one level in turn;
    log every call: (its level, its decision, when it started and ended)."""
    while time.perf_counter() < stop:
        for name, keys in (("user", USER), ("team", TEAM), ("global", GLOBAL)):
            started = time.perf_counter()
            try:
                decision, call = timed(limiter.acquire, keys)
            except Exception as error:  # must never happen: collected and asserted on
                decision, call = error, (started, started)
            with lock:
                log.append((name, decision, call))
        time.sleep(0.002)


@pytest.fixture
def no_old_garbage():
    """Keep what earlier tests left on the heap out of the garbage collector's scans while
    this test times each call: late in the whole suite a full collection of it took over
    half a second, which would count as a slow decision."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.mark.slow
def test_killing_redis_mid_stream_turns_each_level_to_its_fail_mode(disposable_redis, no_old_garbage, stalls):
    limiter = limiter_on(disposable_redis.url)
    log, lock = [], threading.Lock()
    start = time.perf_counter()
    threads = [threading.Thread(target=stream_decisions, args=(limiter, start + 1.0, log, lock)) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    killed_at = time.perf_counter()
    disposable_redis.kill()
    for thread in threads:
        thread.join()
    stalls.stop()

    assert [d for _, d, _ in log if isinstance(d, Exception)] == []
    assert max(stalls.own_time(*call) for *_, call in log) < LONGEST_CALL
    before = [d for _, d, (_, ended) in log if ended < killed_at]
    # Calls that started once every call in flight at the kill had had time to fail.
    settled_at = killed_at + LONGEST_CALL + stalls.during(killed_at, killed_at + LONGEST_CALL)
    after = [(name, d) for name, d, (started, _) in log if started > settled_at]
    assert before and not any(d.degraded for d in before)
    assert after and all(d.degraded for _, d in after)
    assert all(d.allowed for name, d in after if name == "user")
    assert all(d.reason == "STORE_UNAVAILABLE" for name, d in after if name == "team")
    # The global level's local fallback has 2 of its 8 for the whole process.
    assert sum(d.allowed for name, d in after if name == "global") <= 2


@pytest.mark.slow
def test_decisions_go_back_to_redis_within_a_second_of_its_restart(disposable_redis, stalls):
    limiter = limiter_on(disposable_redis.url)
    assert not limiter.acquire(TEAM).degraded
    disposable_redis.kill()
    stop = time.monotonic() + 1.5  # long enough for the breaker's backoff to reach its most
    while time.monotonic() < stop:
        assert limiter.acquire(TEAM).degraded
        time.sleep(0.005)
    disposable_redis.start()  # same port, empty, with no script loaded
    waited = wait_until_decided_on_redis(limiter, TEAM, within=1.0, stalls=stalls)
    assert waited < 1.0
    decision = limiter.acquire(TEAM)
    assert decision.allowed and not decision.degraded
    # The restarted Redis holds the state now: its bucket has the two decisions since.
    assert limiter.inspect("team", "t")[0]["state"]["tokens"] == 98


@pytest.mark.slow
def test_a_frozen_redis_that_thaws_gets_the_decisions_back(disposable_redis, stalls):
    limiter = limiter_on(disposable_redis.url)
    assert not limiter.acquire(USER).degraded
    disposable_redis.freeze()
    decision, call = timed(limiter.acquire, TEAM)
    disposable_redis.thaw()
    assert wait_until_decided_on_redis(limiter, TEAM, within=1.0, stalls=stalls) < 1.0
    stalls.stop()
    assert decision.reason == "STORE_UNAVAILABLE" and stalls.own_time(*call) < LONGEST_CALL
