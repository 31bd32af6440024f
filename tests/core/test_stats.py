"""Denial statistics: counts by blocked_by, the most denied keys per level, windows of whole
minutes on a manual clock, bounded memory, workers that add up, and a Redis outage that
neither breaks a decision nor hides what happened during it.

Every test that takes `new_stats` runs twice: in process (no client) and on a real
redis-server (tests/conftest.py starts it). Flushing threads are off (flush_every=None)
unless a test is about them, so that nothing moves but what the test moves.
"""

import json
import math
import os
import threading
import time

import pytest
import redis

from core import HierarchicalLimiter, ManualClock, MemoryStore
from core.decision import RATE_LIMITED, STORE_UNAVAILABLE, Decision, allowed
from core.errors import ConfigError, InvalidRequest, StoreUnavailable
from core.flusher import FLUSHER
from core.stats import BUFFER_SLACK, EMBEDDED, EMBEDDED_DENIED, KEPT_MINUTES, DenialStats
from core.stats.layout import text
from core.stores.redis import RedisStore, connect

from .helpers import token_bucket

START = 1_800_000_030.0  # half a minute into a minute
MINUTE, HOUR, DAY = 60, 3600, 86400
TEAM_RULE = "team: token_bucket(100, 10/s)"
USER_RULE = "user: token_bucket(10, 1/s)"
ALLOWED = allowed(5.0)


def denial(blocked_by=TEAM_RULE, degraded=False):
    reason = STORE_UNAVAILABLE if degraded else RATE_LIMITED
    return Decision(False, 1.0, blocked_by, reason, 0.0, degraded)


def keys(user="u1", team="acme"):
    return {"user": user, "team": team, "global": "*"}


def minute_of(t):
    return int(t // MINUTE) * MINUTE


@pytest.fixture
def clock():
    return ManualClock(START)


@pytest.fixture(params=["memory", "redis"])
def kind(request):
    return request.param


@pytest.fixture
def new_stats(request, kind, clock):
    """Make DenialStats of the kind under test; on Redis they share one prefix, as the
    workers of one deployment do."""
    clients = []

    def make(**options):
        options = {"clock": clock, "flush_every": None, **options}
        if kind == "memory":
            return DenialStats(**options)
        clients.append(redis.Redis.from_url(request.getfixturevalue("redis_url"), socket_timeout=2))
        return DenialStats(client=clients[-1], **options)

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def server(redis_url, redis_server):
    """Our own client of the session's server, to look at what the statistics wrote."""
    client = redis_server.client(decode_responses=True)
    yield client
    client.close()


def members(stats, name):
    """A sorted set's members, on either kind of statistics store."""
    return stats.client.pipeline().zrange(name, 0, -1).execute()[0]


def redis_stats(url, clock, **options):
    return DenialStats(
        client=redis.Redis.from_url(url, socket_timeout=2),
        clock=clock,
        flush_every=options.pop("flush_every", None),
        **options,
    )


# --- what is counted --------------------------------------------------------------------------


def test_it_counts_denials_by_blocked_by_most_first(new_stats):
    stats = new_stats()
    for _ in range(3):
        stats.record(keys(), denial(TEAM_RULE))
    for _ in range(5):
        stats.record(keys(), denial(USER_RULE))
    report = stats.report(300)
    assert report["denied"] == 8
    assert report["blocked_by"] == [
        {"blocked_by": USER_RULE, "level": "user", "denied": 5},
        {"blocked_by": TEAM_RULE, "level": "team", "denied": 3},
    ]


def test_it_lists_the_most_denied_keys_of_each_level_most_first(new_stats):
    stats = new_stats()
    for user, times in (("ann", 2), ("bob", 7), ("cat", 4), ("dan", 4)):
        for _ in range(times):
            stats.record(keys(user=user), denial(USER_RULE))
    stats.record(keys(team="acme"), denial(TEAM_RULE))
    report = stats.report(300, top=3)
    # Ties are listed by key; `top` cuts the list.
    assert report["top_keys"] == {
        "team": [{"key": "acme", "denied": 1}],
        "user": [
            {"key": "bob", "team": "acme", "denied": 7},
            {"key": "cat", "team": "acme", "denied": 4},
            {"key": "dan", "team": "acme", "denied": 4},
        ],
    }


def test_allowed_decisions_count_as_decisions_not_as_denials(new_stats):
    stats = new_stats()
    for _ in range(4):
        stats.record(keys(), ALLOWED)
    stats.record(keys(), denial())
    report = stats.report(300)
    assert (report["decisions"], report["denied"]) == (5, 1)
    assert report["top_keys"] == {"team": [{"key": "acme", "denied": 1}]}
    assert [entry["denied"] for entry in report["blocked_by"]] == [1]


def test_a_degraded_denial_counts_under_its_levels_store_unavailable(new_stats, unreachable_redis_url, clock):
    limiter = HierarchicalLimiter.from_config(
        {"team": [token_bucket(100, 10)]},
        store=RedisStore(url=unreachable_redis_url),
        clock=clock,
        fail_modes={"team": "closed"},
    )
    stats = new_stats()
    decision = limiter.acquire({"team": "acme"})
    assert decision.degraded and not decision.allowed
    stats.record({"team": "acme"}, decision)
    report = stats.report(300)
    assert report["blocked_by"] == [{"blocked_by": "team: store unavailable", "level": "team", "denied": 1}]
    assert report["top_keys"] == {"team": [{"key": "acme", "denied": 1}]}


def test_it_counts_a_real_limiters_decisions_under_the_limiters_own_names(new_stats, clock):
    limiter = HierarchicalLimiter.from_config(
        {"user": [token_bucket(2, 0)], "team": [token_bucket(100, 0)]}, store=MemoryStore(), clock=clock
    )
    stats = new_stats()
    decisions = []
    for _ in range(5):
        decisions.append(limiter.acquire({"user": "u1", "team": "acme"}))
        stats.record({"user": "u1", "team": "acme"}, decisions[-1])
    blocked_by = decisions[-1].blocked_by
    assert blocked_by.startswith("user: ")
    report = stats.report(60)
    assert (report["decisions"], report["denied"]) == (5, 3)
    assert report["blocked_by"] == [{"blocked_by": blocked_by, "level": "user", "denied": 3}]
    assert report["top_keys"] == {"user": [{"key": "u1", "team": "acme", "denied": 3}]}


def test_a_denial_without_blocked_by_or_key_at_its_level_counts_as_a_denial_only(new_stats):
    stats = new_stats()
    stats.record({"user": "u1"}, Decision(False, 1.0, None, RATE_LIMITED, 0.0))
    stats.record({"user": "u1"}, denial(TEAM_RULE))  # no team key given
    report = stats.report(60)
    assert (report["decisions"], report["denied"]) == (2, 2)
    assert report["blocked_by"] == [{"blocked_by": TEAM_RULE, "level": "team", "denied": 1}]
    assert report["top_keys"] == {}


# --- windows and the series -------------------------------------------------------------------


def test_a_denial_61_minutes_ago_is_outside_a_one_hour_window_and_59_minutes_ago_inside(new_stats, clock):
    stats = new_stats()
    stats.record(keys(user="old"), denial(USER_RULE))
    clock.advance(2 * MINUTE)
    stats.record(keys(user="newer"), denial(USER_RULE))
    clock.advance(59 * MINUTE)  # "old" is 61 minutes ago, "newer" 59
    report = stats.report(HOUR)
    assert report["top_keys"]["user"] == [{"key": "newer", "team": "acme", "denied": 1}]
    assert report["denied"] == 1


def test_a_window_is_read_in_whole_minutes_and_since_says_where_it_starts(new_stats, clock):
    stats = new_stats()
    stats.record(keys(), denial())  # at START, half a minute into its minute
    clock.advance(5 * MINUTE + 10)  # the denial is 5 min 10 s ago, in the minute that overlaps the window
    report = stats.report(5 * MINUTE)
    assert report["since"] == minute_of(START) <= clock() - 5 * MINUTE
    assert (report["until"], report["window"], report["denied"]) == (clock(), 5 * MINUTE, 1)
    clock.advance(MINUTE)  # now the denial's whole minute is before the window
    assert stats.report(5 * MINUTE)["denied"] == 0


def test_a_long_windows_top_keys_add_whole_hours_to_the_minutes_at_its_edge(new_stats, clock):
    stats = new_stats()
    hour = int(START // HOUR) * HOUR
    for minute, user in ((10, "early"), (40, "edge"), (65, "edge"), (70, "late")):
        clock.advance(hour + minute * MINUTE - clock())
        stats.record(keys(user=user), denial(USER_RULE))
    clock.advance(10 * MINUTE)  # 80 minutes past the first hour: the window starts at its 20th
    report = stats.report(HOUR)
    # "early" is in the first hour but before the window: that hour is read minute by minute.
    assert report["top_keys"]["user"] == [
        {"key": "edge", "team": "acme", "denied": 2},
        {"key": "late", "team": "acme", "denied": 1},
    ]
    assert report["denied"] == 3


def test_the_series_has_one_point_per_step_zeros_included(new_stats, clock):
    stats = new_stats()
    stats.record(keys(), denial(TEAM_RULE))
    stats.record(keys(), ALLOWED)
    clock.advance(2 * MINUTE)
    stats.record(keys(), denial(USER_RULE))
    series = stats.report(5 * MINUTE)["series"]
    assert [point["at"] for point in series] == [minute_of(START) + i * MINUTE for i in range(-3, 3)]
    assert series[3] == {
        "at": minute_of(START),
        "decisions": 2,
        "denied": 1,
        "shadow_denied": 0,
        "over_quota": 0,
        "embedded": 0,
        "embedded_denied": 0,
        "blocked_by": {TEAM_RULE: 1},
    }
    assert series[4] == {
        "at": minute_of(START) + MINUTE,
        "decisions": 0,
        "denied": 0,
        "shadow_denied": 0,
        "over_quota": 0,
        "embedded": 0,
        "embedded_denied": 0,
        "blocked_by": {},
    }
    assert series[5]["blocked_by"] == {USER_RULE: 1}


def test_decisions_a_django_app_made_are_counted_apart_as_embedded(new_stats, clock):
    stats = new_stats()
    stats.record(keys(), ALLOWED, embedded=True)
    stats.record(keys(), denial(USER_RULE), embedded=True)
    stats.record(keys(), denial(TEAM_RULE))
    stats.record(keys(), ALLOWED)
    clock.advance(MINUTE)
    stats.record(keys(user="u2"), denial(USER_RULE), embedded=True)
    stats.flush()
    report = stats.report(5 * MINUTE)
    assert (report["decisions"], report["denied"]) == (5, 3)
    assert (report["embedded"], report["embedded_denied"]) == (3, 2)
    points = [(point["embedded"], point["embedded_denied"]) for point in report["series"] if point["decisions"]]
    assert points == [(2, 1), (1, 1)]
    # Counted like any other decision everywhere else: the rule, the key, the tenant.
    assert report["blocked_by"][0] == {"blocked_by": USER_RULE, "level": "user", "denied": 2}
    assert report["top_tenants"] == [{"tenant": "acme", "denied": 3}]
    [totals] = stats.client.pipeline().hgetall(f"la:{{stats}}:m:{minute_of(START)}").execute()
    fields = {text(field): int(n) for field, n in totals.items()}
    assert (fields[EMBEDDED], fields[EMBEDDED_DENIED]) == (2, 1)  # the names core.stats.layout gives


def test_a_step_groups_the_series_on_multiples_of_the_step(new_stats, clock):
    stats = new_stats()
    step = 15 * MINUTE
    for _ in range(24 * 4):  # a denial every 15 minutes for a day
        stats.record(keys(), denial())
        clock.advance(step)
    report = stats.report(24 * HOUR, step=step)
    assert all(point["at"] % step == 0 for point in report["series"])
    assert len(report["series"]) in (96, 97)
    assert sum(point["denied"] for point in report["series"]) == report["denied"] == 96
    assert report["top_keys"]["team"] == [{"key": "acme", "denied": 96}]


def test_the_report_is_plain_json(new_stats):
    stats = new_stats()
    stats.record(keys(user="émile"), denial(USER_RULE))
    report = stats.report(HOUR, step=900)
    assert json.loads(json.dumps(report, allow_nan=False)) == report


@pytest.mark.parametrize("window", [0, -60, 25 * HOUR + 1, math.nan, math.inf, "300", None, True])
def test_it_refuses_a_window_that_is_not_within_retention(new_stats, window):
    with pytest.raises(InvalidRequest) as refused:
        new_stats().report(window)
    assert refused.value.field == "window"


@pytest.mark.parametrize(
    "field, value",
    [("step", 30), ("step", 90), ("step", 0), ("step", "60"), ("top", 0), ("top", 101), ("top", 1.5), ("top", True)],
)
def test_it_refuses_a_bad_step_or_top(new_stats, field, value):
    with pytest.raises(InvalidRequest) as refused:
        new_stats().report(HOUR, **{field: value})
    assert refused.value.field == field


@pytest.mark.parametrize(
    "option, value", [("top_k", 0), ("top_k", 2.5), ("retention", 30), ("flush_every", 0), ("flush_every", math.nan)]
)
def test_it_refuses_options_that_cannot_work(option, value):
    with pytest.raises(ConfigError) as refused:
        DenialStats(**{option: value})
    assert refused.value.path == option


# --- bounded memory ---------------------------------------------------------------------------


def test_ten_thousand_distinct_keys_in_a_minute_leave_top_k_per_level(new_stats, kind, request, clock):
    stats = new_stats(top_k=20)
    for user, times in (("hot-1", 50), ("hot-2", 40)):
        for _ in range(times):
            stats.record(keys(user=user), denial(USER_RULE))
    for i in range(10_000):
        stats.record(keys(user=f"u{i:05}"), denial(USER_RULE))
        assert len(stats._buffer[minute_of(START)].keys["user"]) < BUFFER_SLACK * 20
    stats.flush()
    assert len(members(stats, f"la:{{stats}}:k:{minute_of(START)}:user")) == 20
    assert len(members(stats, f"la:{{stats}}:h:{int(START // HOUR) * HOUR}:user")) == 20
    report = stats.report(MINUTE, top=3)
    assert report["denied"] == 10_090  # totals and blocked_by stay exact
    assert report["blocked_by"][0]["denied"] == 10_090
    assert report["top_keys"]["user"][:2] == [
        {"key": "hot-1", "team": "acme", "denied": 50},
        {"key": "hot-2", "team": "acme", "denied": 40},
    ]


@pytest.mark.parametrize("kind", ["memory"], indirect=True)
def test_in_process_minutes_past_retention_are_forgotten(new_stats, clock):
    stats = new_stats(retention=HOUR)
    stats.record(keys(), denial())
    stats.flush()
    clock.advance(2 * HOUR + 3 * MINUTE)  # past the end of the first hour plus retention
    stats.record(keys(), denial())
    stats.flush()
    m1, h1 = minute_of(clock()), int(clock() // HOUR) * HOUR
    # Only the last minute's and hour's buckets are left (the tenant's own series are kept longer).
    left = [name for name in stats.client.keys() if ":{stats}:u" not in name and ":{stats}:r" not in name]
    assert [name for name in left if not name.endswith("seen")] == sorted(
        [f"la:{{stats}}:m:{m1}", f"la:{{stats}}:k:{m1}:team", f"la:{{stats}}:h:{h1}:team"]
        + [f"la:{{stats}}:t:{m1}", f"la:{{stats}}:ht:{h1}"]
    )


def test_every_redis_key_expires_once_no_window_can_read_it(redis_url, server, clock):
    stats = redis_stats(redis_url, clock, retention=HOUR, usage_minutes=HOUR, usage_hours=2 * HOUR)
    stats.record(keys(), denial(TEAM_RULE))
    stats.record(keys(), denial(USER_RULE))
    clock.advance(MINUTE)
    stats.record(keys(), ALLOWED)
    stats.flush()
    m0, h0 = minute_of(START), int(START // HOUR) * HOUR
    q0, d0 = int(START // 900) * 900, int(START // DAY) * DAY
    assert sorted(server.keys("*")) == sorted(
        [
            f"la:{{stats}}:m:{m0}",
            f"la:{{stats}}:m:{m0 + MINUTE}",  # each minute's totals
            f"la:{{stats}}:k:{m0}:team",
            f"la:{{stats}}:k:{m0}:user",  # the minute's denied keys
            f"la:{{stats}}:t:{m0}",  # and denied tenants
            f"la:{{stats}}:h:{h0}:team",
            f"la:{{stats}}:h:{h0}:user",  # and the hour's
            f"la:{{stats}}:ht:{h0}",
            f"la:{{stats}}:um:{q0}:acme",  # the tenant's minutes, in a quarter-hour hash
            f"la:{{stats}}:uh:{d0}:acme",  # its hours, in a day's hash
            f"la:{{stats}}:ub:{d0}:acme",  # its blocked_by by hour
            f"la:{{stats}}:uu:{h0}:acme",  # its most active users in the hour
            f"la:{{stats}}:ux:{h0}:acme",  # and most denied
            "la:{stats}:seen",  # users seen, trimmed by count and age
            "la:{stats}:rules",  # rule names' short ids, and back
            "la:{stats}:rule-names",
            "la:{stats}:rule-seq",
        ]
    )
    now = clock()
    # A bucket is readable by a window of its retention until its end plus that retention.
    for pattern, end, retention in (
        ("la:{stats}:[mkt]:*", m0 + 2 * MINUTE, HOUR),
        ("la:{stats}:h*", h0 + HOUR, HOUR),
        ("la:{stats}:um:*", q0 + 900, HOUR),
        ("la:{stats}:u[hb]:*", d0 + DAY, 2 * HOUR),
        ("la:{stats}:u[ux]:*", h0 + HOUR, HOUR),
    ):
        for name in server.keys(pattern):
            assert 0 < server.ttl(name) <= end + retention + 60 - now + 1, name
            assert server.ttl(name) > end + retention - now - MINUTE, name
    for name in ("seen", "rules", "rule-names", "rule-seq"):
        assert server.ttl(f"la:{{stats}}:{name}") == -1  # bounded by count, or by the policies' rules


# --- flushing ---------------------------------------------------------------------------------


def test_record_touches_nothing_in_redis_and_a_flush_is_one_multi_exec(redis_url, server, clock):
    stats = redis_stats(redis_url, clock)
    for i in range(100):
        stats.record(keys(user=f"u{i}"), denial(USER_RULE) if i % 2 else ALLOWED)
        clock.advance(1)  # across two minutes
    assert server.dbsize() == 0
    stats._rule_ids({USER_RULE})  # a rule's short id is named once, the first time it denies
    server.config_resetstat()
    stats.flush()
    commands = server.info("commandstats")
    assert commands["cmdstat_multi"]["calls"] == commands["cmdstat_exec"]["calls"] == 1
    assert server.dbsize() > 0


def test_the_report_flushes_this_process_buffer_first(new_stats):
    stats = new_stats()
    stats.record(keys(), denial())
    assert stats.report(MINUTE)["denied"] == 1
    assert stats.report(MINUTE)["denied"] == 1  # and does not count it twice


def test_maybe_flush_flushes_once_flush_every_has_passed_on_the_clock(redis_url, server, clock):
    stats = redis_stats(redis_url, clock, flush_every=1.0)
    FLUSHER.forget(stats)  # the test moves time itself: the flushing thread leaves it alone
    stats.record(keys(), denial())
    clock.advance(0.5)
    stats.maybe_flush()
    assert server.dbsize() == 0
    clock.advance(0.5)
    stats.maybe_flush()
    assert server.dbsize() > 0


def test_a_thread_flushes_without_being_asked(redis_url, server):
    stats = redis_stats(redis_url, time.time, flush_every=0.02)
    stats.record(keys(), denial())
    deadline = time.monotonic() + 5
    while server.dbsize() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)  # polling for the thread, not aiming at an edge
    stats.close()
    assert server.dbsize() > 0
    assert stats.report(MINUTE)["denied"] == 1


def test_two_workers_counts_add_up(redis_url, clock):
    worker_a, worker_b = redis_stats(redis_url, clock), redis_stats(redis_url, clock)
    for _ in range(3):
        worker_a.record(keys(user="u1"), denial(USER_RULE))
        worker_b.record(keys(user="u1"), denial(USER_RULE))
    worker_a.record(keys(team="acme"), denial(TEAM_RULE))  # a level worker_b has never seen
    worker_b.record(keys(), ALLOWED)
    worker_a.flush()
    for report in (worker_b.report(MINUTE), worker_a.report(MINUTE)):
        assert (report["decisions"], report["denied"]) == (8, 7)
        assert report["top_keys"] == {
            "team": [{"key": "acme", "denied": 1}],
            "user": [{"key": "u1", "team": "acme", "denied": 6}],
        }


def test_counts_are_thread_safe(new_stats, frequent_thread_switches):
    stats = new_stats()
    threads = [threading.Thread(target=lambda: [stats.record(keys(), denial()) for _ in range(2000)]) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report = stats.report(MINUTE)
    assert (report["decisions"], report["top_keys"]["team"][0]["denied"]) == (16_000, 16_000)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_worker_counts_its_own_decisions_not_its_parents_buffer(redis_url, clock):
    stats = redis_stats(redis_url, clock)
    stats.record(keys(), denial())  # buffered in the parent when it forks
    child = os.fork()
    if child == 0:  # pragma: no cover (runs in the child)
        stats.record(keys(), ALLOWED)
        stats.flush()
        os._exit(0)
    os.waitpid(child, 0)
    report = stats.report(MINUTE)
    assert (report["decisions"], report["denied"]) == (2, 1)


# --- Redis down -------------------------------------------------------------------------------


def test_with_redis_unreachable_record_and_flush_go_on_and_report_raises(unreachable_redis_url, clock):
    stats = DenialStats(client=connect(unreachable_redis_url), clock=clock, flush_every=None)
    stats.record(keys(), denial(degraded=True))
    stats.flush()
    clock.advance(1)
    stats.maybe_flush()
    with pytest.raises(StoreUnavailable):
        stats.report(MINUTE)
    stats.close()


def test_counts_made_while_redis_was_down_arrive_when_it_is_back(disposable_redis, clock):
    stats = DenialStats(client=connect(disposable_redis.url, timeout=1.0), clock=clock, flush_every=None)
    stats.record(keys(), ALLOWED)
    stats.flush()
    disposable_redis.kill()  # no persistence: what was flushed is gone with it
    stats.record(keys(), denial("team: store unavailable", degraded=True))
    stats.flush()
    stats.record(keys(), allowed(5.0, over_quota=("team: quota(100/day, soft)",)))
    stats.flush()  # kept twice: the two flushes' counts are added up
    with pytest.raises(StoreUnavailable):
        stats.report(MINUTE)
    disposable_redis.start()
    report = stats.report(MINUTE)
    assert report["blocked_by"] == [{"blocked_by": "team: store unavailable", "level": "team", "denied": 1}]
    assert report["over_quota_by"] == [{"blocked_by": "team: quota(100/day, soft)", "level": "team", "denied": 1}]
    assert stats.usage("acme", MINUTE)["over_quota_by"] == {"team: quota(100/day, soft)": 1}


def test_a_long_outage_keeps_only_the_newest_minutes(disposable_redis, clock):
    stats = DenialStats(client=connect(disposable_redis.url, timeout=1.0), clock=clock, flush_every=None)
    disposable_redis.kill()
    for _ in range(KEPT_MINUTES + 5):
        stats.record(keys(), denial())
        stats.flush()
        clock.advance(MINUTE)
    assert len(stats._kept.minutes) == KEPT_MINUTES
    assert stats.dropped_minutes == 5
    disposable_redis.start()
    assert stats.report(HOUR)["denied"] == KEPT_MINUTES


def test_record_never_raises_whatever_it_is_given(new_stats):
    stats = new_stats()
    stats.record(None, denial())  # no keys mapping at all
    stats.record(keys(), None)  # no decision
    broken = new_stats()
    broken.clock = lambda: 1 / 0
    broken.record(keys(), denial())
    broken.maybe_flush()
    assert (stats.failed_records, broken.failed_records) == (2, 1)
