"""Exactness under every algorithm: 4 processes send 200 requests at the same moment at one
key whose rule admits 50, and exactly 50 are admitted, whatever the rule type. Then the same
across a Redis restart: what was taken before the restart stays taken when Redis keeps an
append-only file (`appendfsync everysec`), and is forgotten when it keeps nothing. Then a
quota spent by reservations settled above and below their estimates, and credits topped up
while they are spent, from 4 processes on Redis and on the 3-primary cluster: the quota ends
exactly spent.

Every rule is set so that nothing comes back during the test (no refill, hour-long windows
and leases, credits or a month's quota), so the limit is a count, not a rate.
"""

import time

import pytest

from core import RULES, HierarchicalLimiter
from core.periods import period_bounds
from core.stores import store_from_url
from core.stores.redis import RedisStore

from .deciders import decide_from_processes, settle_from_processes

pytestmark = pytest.mark.slow

LIMIT = 50
HOUR = 3600
RULE_FOR = {
    "token_bucket": {"type": "token_bucket", "capacity": LIMIT, "per_second": 0},
    # The slowest drip there is over a one-second test: 50 + 0.001 tokens.
    "gcra": {"type": "gcra", "rate": 0.001, "burst": LIMIT},
    "fixed_window": {"type": "fixed_window", "limit": LIMIT, "window": HOUR},
    "sliding_window": {"type": "sliding_window", "limit": LIMIT, "window": HOUR},
    "sliding_window_counter": {"type": "sliding_window_counter", "limit": LIMIT, "window": HOUR},
    "concurrency": {"type": "concurrency", "limit": LIMIT, "lease": HOUR},
    "quota": {"type": "quota", "limit": LIMIT, "period": "none"},
}
TAKEN_BEFORE_RESTART = 30


def test_every_built_in_rule_type_is_covered():
    assert set(RULE_FOR) == {name for name, rule in RULES.items() if rule.__module__.startswith("core.")}


def clear_of_a_window_boundary() -> None:
    """A fixed window starts again on the hour (epoch time): a test that straddled it would
    see two windows' worth. Within 15 s of the hour, wait until it has passed."""
    left = HOUR - time.time() % HOUR
    if left < 15:
        time.sleep(left + 0.5)  # waiting out a boundary, not aiming at it


@pytest.mark.parametrize("rule_type", sorted(RULE_FOR))
def test_200_simultaneous_requests_from_4_processes_admit_exactly_the_limit(redis_url, rule_type):
    clear_of_a_window_boundary()
    answers = decide_from_processes(
        redis_url, {"team": [RULE_FOR[rule_type]]}, {"team": f"acme-{rule_type}"}, processes=4, threads=50
    )
    assert len(answers) == 200
    assert not any(degraded for _, degraded in answers)
    assert sum(allowed for allowed, _ in answers) == LIMIT


# --- across a restart ------------------------------------------------------------------------
# One limiter with a level per rule type, so that one restart serves them all.

EVERY_TYPE = {rule_type: [spec] for rule_type, spec in RULE_FOR.items()}


def admitted(limiter, rule_type: str, requests: int) -> int:
    decisions = [limiter.acquire({rule_type: "k"}) for _ in range(requests)]
    assert not any(d.degraded for d in decisions)
    return sum(d.allowed for d in decisions)


def take_restart_and_take_again(server, restart) -> dict[str, tuple[int, int]]:
    """For each rule type: how many of 30 were admitted before the restart, and of 40 after."""
    clear_of_a_window_boundary()
    store = RedisStore(url=server.url, prefix="restart", timeout=2.0)
    limiter = HierarchicalLimiter.from_config(EVERY_TYPE, store=store)
    try:
        before = {t: admitted(limiter, t, TAKEN_BEFORE_RESTART) for t in RULE_FOR}
        restart()
        # The store's breaker may have seen the restart; a ping waits out its backoff.
        deadline = time.monotonic() + 5
        while True:
            try:
                store.ping()
                break
            except Exception:
                assert time.monotonic() < deadline, "Redis did not come back"
                time.sleep(0.05)  # polling the restarted server
        after = {t: admitted(limiter, t, 40) for t in RULE_FOR}
    finally:
        store.close()
    return {t: (before[t], after[t]) for t in RULE_FOR}


@pytest.mark.parametrize("stop", ["shut down", "killed"])
def test_with_an_append_only_file_a_restart_forgets_nothing_taken(persistent_redis, stop):
    def restart():
        # SIGTERM writes everything out; SIGKILL loses what the OS had not been handed, and
        # Redis hands the AOF every write before it answers, so nothing answered is lost.
        # Only the host crashing loses up to the last second (everysec fsync).
        persistent_redis.shutdown() if stop == "shut down" else persistent_redis.kill()
        persistent_redis.start()

    counts = take_restart_and_take_again(persistent_redis, restart)
    print(f"\nAOF everysec, Redis {stop}: admitted before/after the restart {counts}")
    assert counts == {t: (TAKEN_BEFORE_RESTART, LIMIT - TAKEN_BEFORE_RESTART) for t in RULE_FOR}


def test_without_persistence_a_restart_forgets_everything_taken(disposable_redis):
    counts = take_restart_and_take_again(disposable_redis, disposable_redis.restart)
    # Each rule starts afresh: 30 + 40 admitted where 50 was the limit.
    assert counts == {t: (TAKEN_BEFORE_RESTART, 40) for t in RULE_FOR}


# --- a quota spent by reservations settled above and below their estimates -----------------------

QUOTA = 200


def clear_of_a_month_end() -> None:
    """A month's quota starts again on the 1st: within 30 s of it, wait until it has passed."""
    left = period_bounds("month", "UTC", time.time())[1] - time.time()
    if left < 30:
        time.sleep(left + 0.5)  # waiting out a boundary, not aiming at it


@pytest.mark.parametrize("period", ["month", "none"])
@pytest.mark.parametrize("where", ["redis", "cluster"])
def test_reservations_settled_above_and_below_their_estimates_spend_a_quota_exactly(request, where, period):
    clear_of_a_month_end()
    url = request.getfixturevalue("redis_url" if where == "redis" else "redis_cluster_url")
    config = {"team": [{"type": "quota", "limit": QUOTA, "period": period}]}
    keys = {"team": f"acme-{period}"}
    # Each settlement is above or below its estimate of 4: for the month's quota less in all
    # (room is left to spend), for credits more (an overspend that the top-ups pay off). The
    # even threads (52 of 100) top credits up by 2 each while every thread spends.
    actuals, top_up = ((1.0, 5.0, 7.5), ("team", 0, 2.0)) if period == "none" else ((1.0, 3.0, 5.5), None)
    totals = settle_from_processes(url, config, keys, 4, 25, estimate=4.0, actuals=actuals, top_up=top_up)
    # 100 reservations of 4 at once: exactly 50 fit in 200.
    assert totals["reserved"] == QUOTA // 4
    store = store_from_url(url, timeout=2.0)
    try:
        limiter = HierarchicalLimiter.from_config(config, store=store)
        used = limiter.inspect("team", keys["team"])[0]["state"]["used"]
        # Every settlement charged its actual cost, every spend 1, every top-up came off: exactly.
        assert used == totals["charged"] + totals["spent"] - totals["topped_up"]
        rest = 0
        while limiter.acquire(keys).allowed:
            rest += 1
        state = limiter.inspect("team", keys["team"])[0]["state"]
    finally:
        store.close()
    print(f"\n{where}, {period}: {totals}, then {rest} more")
    if totals["charged"] >= QUOTA and not top_up:
        assert totals["spent"] == rest == 0 and state["remaining"] == QUOTA - totals["charged"]  # the overspend shows
    else:  # spent to the last whole unit (a spend is 1), none twice
        left = state["remaining"]
        assert 0 <= left < 1 and totals["charged"] + totals["spent"] + rest + left == QUOTA + totals["topped_up"]
