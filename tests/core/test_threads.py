"""Floods of threads: decisions stay exact at every level. Nothing refills, so the totals
do not depend on timing, only on the limiter never selling the same unit twice."""

import threading
from collections import Counter

import pytest

from .helpers import concurrency, state_of, token_bucket

pytestmark = pytest.mark.usefixtures("frequent_thread_switches")

THREADS = 200
USER_CAPACITY, TEAM_CAPACITY = 5, 12

# Four teams of 5 users (25 user tokens > 12: the team binds) and one of 2 users
# (10 user tokens < 12: the users bind).
TEAMS = {
    **{f"team-{t}": [f"team-{t}-user-{u}" for u in range(5)] for t in range(4)},
    "small-team": ["small-team-user-0", "small-team-user-1"],
}
KEY_SETS = [{"user": user, "team": team, "global": "*"} for team, users in TEAMS.items() for user in users]


def expected_team_total(team):
    return min(TEAM_CAPACITY, USER_CAPACITY * len(TEAMS[team]))


def flood(limiter, passes=3):
    """Every thread walks the key sets `passes` times, each from its own offset; returns
    how many requests each user got through."""
    start = threading.Barrier(THREADS)
    per_thread = [Counter() for _ in range(THREADS)]

    def worker(n):
        start.wait()
        for i in range(passes * len(KEY_SETS)):
            keys = KEY_SETS[(n + i) % len(KEY_SETS)]
            if limiter.acquire(keys).allowed:
                per_thread[n][keys["user"]] += 1

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(per_thread, Counter())


def three_levels(build, global_capacity):
    return build(
        {
            "user": [token_bucket(USER_CAPACITY, 0)],
            "team": [token_bucket(TEAM_CAPACITY, 0)],
            "global": [token_bucket(global_capacity, 0)],
        }
    )


@pytest.mark.slow
def test_a_flood_over_three_levels_takes_exactly_what_each_level_allows(build):
    limiter = three_levels(build, 1000)
    by_user = flood(limiter)
    for team, users in TEAMS.items():
        assert all(by_user[user] <= USER_CAPACITY for user in users)
        assert sum(by_user[user] for user in users) == expected_team_total(team), team
    expected_global = sum(expected_team_total(team) for team in TEAMS)
    assert expected_global == 58
    assert sum(by_user.values()) == expected_global
    # The buckets agree with the decisions: no take was lost or made twice.
    assert state_of(limiter, "global", "*")["tokens"] == 1000 - expected_global
    for team, users in TEAMS.items():
        assert state_of(limiter, "team", team)["tokens"] == TEAM_CAPACITY - expected_team_total(team)
        for user in users:
            assert state_of(limiter, "user", user)["tokens"] == USER_CAPACITY - by_user[user]


@pytest.mark.slow
def test_a_flood_stops_at_exactly_the_global_capacity_when_that_binds_first(build):
    limiter = three_levels(build, 40)
    by_user = flood(limiter)
    assert sum(by_user.values()) == 40
    assert state_of(limiter, "global", "*")["tokens"] == 0
    for team, users in TEAMS.items():
        assert sum(by_user[user] for user in users) <= expected_team_total(team)
        assert all(by_user[user] <= USER_CAPACITY for user in users)


def test_a_flood_of_threads_gets_exactly_the_concurrency_limit_of_slots(build):
    # A manual clock (build's), so no lease can run out while the threads start.
    limiter = build({"user": [concurrency(10)]})
    start = threading.Barrier(100)
    leases = []

    def worker():
        start.wait()
        decision = limiter.acquire({"user": "hot"})
        if decision.allowed:
            leases.append(decision.lease)

    threads = [threading.Thread(target=worker) for _ in range(100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(leases) == 10
    assert len(set(leases)) == 10
    assert state_of(limiter, "user", "hot")["in_flight"] == 10
