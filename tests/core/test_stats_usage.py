"""Decision statistics per tenant: attribution of every decision to its tenant and user, each
tenant's series per minute and per hour, shadow rules and soft quotas gone over counted, users
found by prefix, and reservations left open counted once as expired.

Every test that takes `new_stats` runs in process and on a real redis-server.
"""

import pytest

from core.decision import RATE_LIMITED, Decision, allowed
from core.errors import InvalidRequest
from core.stats import EXPIRY_GRACE, SWEEP_EVERY
from core.stats.layout import text

from .test_stats import (  # noqa: F401  (fixtures)
    DAY,
    HOUR,
    MINUTE,
    START,
    TEAM_RULE,
    USER_RULE,
    clock,
    keys,
    kind,
    members,
    minute_of,
    new_stats,
    redis_stats,
    server,
)

GLOBAL_RULE = "global: token_bucket(100000, 10000/s)"
SHADOW_RULE = "user: sliding_window(5, 60) [shadow]"
QUOTA = "team: quota(100/day, soft)"
USER_QUOTA = "user: quota(10/hour, soft)"


def denial(blocked_by=USER_RULE, shadows=()):
    return Decision(False, 1.0, blocked_by, RATE_LIMITED, 0.0, shadow_blocked=tuple(shadows))


def allow(shadows=()):
    return allowed(5.0)._replace(shadow_blocked=tuple(shadows))


def over(*quotas, shadows=()):
    """Let go past the soft quotas `quotas`."""
    return allowed(5.0, shadow_blocked=tuple(shadows), over_quota=quotas)


def hash_of(stats, name):
    """A hash's fields and counts, on either kind of statistics store."""
    return {text(field): float(value) for field, value in stats.client.pipeline().hgetall(name).execute()[0].items()}


# --- attribution ------------------------------------------------------------------------------


def test_a_tenants_users_denials_make_it_a_top_tenant(new_stats):
    stats = new_stats()
    for user in ("alice", "bob", "carol"):
        for _ in range(3):
            stats.record(keys(user=user, team="acme"), denial(USER_RULE))
    stats.record(keys(user="dave", team="acme"), denial(GLOBAL_RULE))
    stats.record(keys(user="erin", team="initech"), denial(TEAM_RULE))
    report = stats.report(300)
    # Denials at the user and global levels count for the tenant, not only the team level's.
    assert report["top_tenants"] == [{"tenant": "acme", "denied": 10}, {"tenant": "initech", "denied": 1}]
    assert report["top_keys"]["team"] == [{"key": "initech", "denied": 1}]


def test_one_user_id_in_two_teams_is_two_users(new_stats):
    stats = new_stats()
    for _ in range(4):
        stats.record(keys(user="shared", team="acme"), denial())
    for _ in range(2):
        stats.record(keys(user="shared", team="initech"), denial())
    assert stats.report(300)["top_keys"]["user"] == [
        {"key": "shared", "team": "acme", "denied": 4},
        {"key": "shared", "team": "initech", "denied": 2},
    ]


def test_a_user_denied_without_a_team_key_has_no_team(new_stats):
    stats = new_stats()
    stats.record({"user": "loner"}, denial())
    report = stats.report(300)
    assert report["top_keys"]["user"] == [{"key": "loner", "team": None, "denied": 1}]
    assert report["top_tenants"] == []


# --- a tenant's series ------------------------------------------------------------------------


def test_a_tenants_minutes_count_decisions_allowed_denied_shadow_denied_and_cost(new_stats, clock):
    stats = new_stats()
    stats.record(keys(team="acme"), allow(), cost=2.5)
    stats.record(keys(team="acme"), allow([SHADOW_RULE]), cost=4)
    stats.record(keys(team="acme"), denial(USER_RULE), cost=100)  # a denial takes nothing
    stats.record(keys(team="other"), allow(), cost=7)
    clock.advance(2 * MINUTE)
    stats.record(keys(team="acme"), allow(), cost=1)
    usage = stats.usage("acme", 5 * MINUTE, step=MINUTE)
    now_minute = minute_of(clock())
    assert [point["start"] for point in usage["series"]] == list(range(now_minute - 5 * MINUTE, now_minute + 1, MINUTE))
    by_start = {point["start"]: point for point in usage["series"]}
    assert by_start[minute_of(START)] == {
        "start": minute_of(START),
        "decisions": 3,
        "allowed": 2,
        "denied": 1,
        "shadow_denied": 1,
        "over_quota": 0,
        "cost": 6.5,
    }
    assert by_start[minute_of(START) + MINUTE]["decisions"] == 0
    assert by_start[now_minute]["cost"] == 1
    assert usage["blocked_by"] == {USER_RULE: 1}
    assert usage["shadow_blocked_by"] == {SHADOW_RULE: 1}
    assert usage["has_traffic"] and usage["tenant"] == "acme"


def test_a_tenants_hours_reach_back_as_far_as_configured(new_stats, clock):
    stats = new_stats(usage_minutes=HOUR, usage_hours=3 * DAY)
    for _ in range(3):
        stats.record(keys(team="acme"), allow(), cost=10)
        stats.record(keys(team="acme"), denial(TEAM_RULE))
        clock.advance(DAY)
    usage = stats.usage("acme", 3 * DAY, step=HOUR)
    assert len(usage["series"]) == 3 * 24 + 1
    busy = [point for point in usage["series"] if point["decisions"]]
    assert [(p["start"], p["allowed"], p["denied"], p["cost"]) for p in busy] == [
        (int(START // HOUR) * HOUR + day * DAY, 1, 1, 10) for day in range(3)
    ]
    assert usage["blocked_by"] == {TEAM_RULE: 3}
    # The minutes are kept for an hour here: a longer window at that step is refused.
    with pytest.raises(InvalidRequest) as refused:
        stats.usage("acme", 2 * HOUR, step=MINUTE)
    assert refused.value.field == "window"


@pytest.mark.parametrize("step", [0, 30, 120, 900, "60", True, 60.5])
def test_a_usage_step_other_than_a_minute_or_an_hour_is_refused(new_stats, step):
    with pytest.raises(InvalidRequest) as refused:
        new_stats().usage("acme", HOUR, step=step)
    assert refused.value.field == "step"


def test_every_tenant_with_traffic_has_its_own_exact_series(new_stats):
    stats = new_stats(top_k=5)
    for i in range(300):
        for _ in range(i % 4 + 1):
            stats.record(keys(team=f"t{i:03}"), allow(), cost=1)
    for i in (0, 150, 299):
        series = stats.usage(f"t{i:03}", MINUTE)["series"]
        assert sum(point["decisions"] for point in series) == i % 4 + 1


def test_a_tenant_never_seen_has_no_traffic(new_stats):
    stats = new_stats()
    stats.record(keys(team="acme"), allow())
    usage = stats.usage("nobody", HOUR)
    assert not usage["has_traffic"] and usage["tier"] is None
    assert usage["blocked_by"] == usage["shadow_blocked_by"] == usage["over_quota_by"] == {}
    assert usage["top_users"] == []


def test_the_tier_is_the_one_the_tenant_resolved_to_when_its_counts_were_sent(new_stats, clock):
    tiers = {"acme": "pro"}
    stats = new_stats(tier_of=tiers.get)
    stats.record(keys(team="acme"), allow())
    stats.record(keys(team="stranger"), allow())
    assert stats.usage("acme", HOUR)["tier"] == "pro"
    assert stats.usage("stranger", HOUR)["tier"] is None
    tiers["acme"] = "enterprise"
    clock.advance(HOUR)
    stats.record(keys(team="acme"), allow())
    assert stats.usage("acme", 2 * HOUR)["tier"] == "enterprise"


def test_a_tenants_most_throttled_users_come_first_with_their_decisions(new_stats):
    stats = new_stats()
    for user, allowed_n, denied_n in (("alice", 5, 3), ("bob", 1, 6), ("carol", 9, 0)):
        for _ in range(allowed_n):
            stats.record(keys(user=user, team="acme"), allow())
        for _ in range(denied_n):
            stats.record(keys(user=user, team="acme"), denial())
    stats.record(keys(user="alice", team="initech"), denial())  # another team's alice
    assert stats.usage("acme", HOUR)["top_users"] == [
        {"user": "bob", "decisions": 7, "denied": 6},
        {"user": "alice", "decisions": 8, "denied": 3},
        {"user": "carol", "decisions": 9, "denied": 0},
    ]
    assert stats.usage("acme", HOUR, top=1)["top_users"] == [{"user": "bob", "decisions": 7, "denied": 6}]


def test_a_breakdown_covers_the_whole_hours_the_window_touches(new_stats, clock):
    stats = new_stats()
    hour = int(START // HOUR) * HOUR
    clock.advance(hour + 5 * MINUTE - clock())
    stats.record(keys(team="acme"), denial(USER_RULE))
    clock.advance(HOUR)  # 65 minutes after the hour began
    stats.record(keys(team="acme"), denial(TEAM_RULE))
    usage = stats.usage("acme", 4 * MINUTE)
    assert usage["breakdown_since"] == hour + HOUR
    assert usage["blocked_by"] == {TEAM_RULE: 1}
    assert sum(point["denied"] for point in usage["series"]) == 1


def test_a_tenants_minutes_and_hours_stay_in_redis_compact_encoding_for_a_whole_day(redis_url, server, clock):
    stats = redis_stats(redis_url, clock, tier_of=lambda tenant: "pro")
    for _ in range(24 * 60):
        # Every field of a minute written: decisions, denied, shadow, over a quota, cost.
        stats.record(keys(team="acme"), over(QUOTA, shadows=[SHADOW_RULE]), cost=1.5)
        stats.record(keys(team="acme"), denial(USER_RULE))
        stats.flush()
        clock.advance(MINUTE)
    series_keys = server.keys("la:{stats}:u[mh]:*")
    assert len(server.keys("la:{stats}:um:*")) in (96, 97) and len(server.keys("la:{stats}:uh:*")) <= 2
    assert {server.object("encoding", name) for name in series_keys} == {"listpack"}
    assert max(server.hlen(name) for name in server.keys("la:{stats}:um:*")) == 15 * 5
    usage = stats.usage("acme", DAY)
    assert sum(point["decisions"] for point in usage["series"]) == 2 * 24 * 60
    assert sum(point["over_quota"] for point in usage["series"]) == 24 * 60


# --- shadow rules -----------------------------------------------------------------------------


def test_shadow_rules_would_be_denials_are_counted_by_rule(new_stats):
    stats = new_stats()
    stats.record(keys(), allow([SHADOW_RULE]))
    stats.record(keys(), allow([SHADOW_RULE, "team: gcra(1, 1) [shadow]"]))
    stats.record(keys(), denial(TEAM_RULE, [SHADOW_RULE]))
    stats.record(keys(), allow())
    report = stats.report(300)
    assert report["shadow_denied"] == 3
    assert report["shadow_blocked_by"] == [
        {"blocked_by": SHADOW_RULE, "level": "user", "denied": 3},
        {"blocked_by": "team: gcra(1, 1) [shadow]", "level": "team", "denied": 1},
    ]
    assert report["denied"] == 1
    assert sum(point["shadow_denied"] for point in report["series"]) == 3


# --- soft quotas gone over --------------------------------------------------------------------


def test_decisions_let_go_past_a_soft_quota_are_counted_by_quota(new_stats):
    stats = new_stats()
    stats.record(keys(), over(QUOTA))
    stats.record(keys(), over(QUOTA, USER_QUOTA))  # over two quotas: counted once, and for both
    stats.record(keys(), over(QUOTA, shadows=[SHADOW_RULE]))
    stats.record(keys(), allow())
    stats.record(keys(), denial(TEAM_RULE))
    report = stats.report(300)
    assert (report["decisions"], report["denied"], report["shadow_denied"], report["over_quota"]) == (5, 1, 1, 3)
    assert report["over_quota_by"] == [
        {"blocked_by": QUOTA, "level": "team", "denied": 3},
        {"blocked_by": USER_QUOTA, "level": "user", "denied": 1},
    ]
    # A quota gone over let the request go: it is no blocked_by.
    assert report["blocked_by"] == [{"blocked_by": TEAM_RULE, "level": "team", "denied": 1}]
    assert [point["over_quota"] for point in report["series"] if point["over_quota"]] == [3]


def test_a_tenants_minutes_hours_and_breakdown_count_its_decisions_over_a_soft_quota(new_stats, clock):
    stats = new_stats()
    hour = int(START // HOUR) * HOUR
    stats.record(keys(team="acme"), over(QUOTA), cost=3)
    stats.record(keys(team="acme"), allow(), cost=1)
    stats.record(keys(team="initech"), over(QUOTA))
    clock.advance(2 * MINUTE)
    stats.record(keys(team="acme"), over(QUOTA, USER_QUOTA))
    stats.flush()  # the hour's counts: two minutes added up in one flush, then one more flush
    clock.advance(MINUTE)
    stats.record(keys(team="acme"), over(QUOTA))
    minutes = stats.usage("acme", 5 * MINUTE, step=MINUTE)
    by_start = {point["start"]: point for point in minutes["series"]}
    assert by_start[minute_of(START)] == {
        "start": minute_of(START),
        "decisions": 2,
        "allowed": 2,
        "denied": 0,
        "shadow_denied": 0,
        "over_quota": 1,
        "cost": 4,
    }
    assert [by_start[minute_of(START) + i * MINUTE]["over_quota"] for i in (1, 2, 3)] == [0, 1, 1]
    assert minutes["over_quota_by"] == {QUOTA: 3, USER_QUOTA: 1}
    hours = stats.usage("acme", DAY, step=HOUR)
    assert [(point["start"], point["over_quota"]) for point in hours["series"] if point["over_quota"]] == [(hour, 3)]
    assert hours["over_quota_by"] == {QUOTA: 3, USER_QUOTA: 1}
    assert stats.usage("initech", HOUR)["over_quota_by"] == {QUOTA: 1}


def test_over_quota_counts_are_kept_under_the_fields_the_layout_names(new_stats):
    stats = new_stats()
    stats.record(keys(team="acme"), over(QUOTA))
    stats.record(keys(team="acme"), over(QUOTA, USER_QUOTA))
    stats.record(keys(team="acme"), allow())
    stats.flush()
    minute, hour = minute_of(START), int(START // HOUR) * HOUR
    quarter, day = minute - minute % (15 * MINUTE), hour - hour % DAY
    totals = hash_of(stats, f"la:{{stats}}:m:{minute}")
    assert (totals["over_quota"], totals["oq:" + QUOTA], totals["oq:" + USER_QUOTA]) == (2, 2, 1)
    assert hash_of(stats, f"la:{{stats}}:um:{quarter}:acme")[f"{(minute - quarter) // MINUTE}o"] == 2
    index = (hour - day) // HOUR
    assert hash_of(stats, f"la:{{stats}}:uh:{day}:acme")[f"{index}o"] == 2
    ids = stats._rule_ids({QUOTA, USER_QUOTA})
    breakdown = hash_of(stats, f"la:{{stats}}:ub:{day}:acme")
    assert (breakdown[f"{index}o{ids[QUOTA]}"], breakdown[f"{index}o{ids[USER_QUOTA]}"]) == (2, 1)


# --- users seen, for search -------------------------------------------------------------------


def test_recently_seen_users_are_found_by_prefix_most_recent_first(new_stats, clock):
    stats = new_stats()
    stats.record(keys(user="alice", team="acme"), allow())
    stats.flush()
    clock.advance(10)
    stats.record(keys(user="alina", team="initech"), denial())
    stats.record(keys(user="bob", team="acme"), allow())
    assert stats.seen_users("ali") == [{"user": "alina", "team": "initech"}, {"user": "alice", "team": "acme"}]
    assert stats.seen_users("ali", limit=1) == [{"user": "alina", "team": "initech"}]
    assert stats.seen_users("carl") == []


def test_a_search_prefix_is_matched_literally(new_stats):
    stats = new_stats()
    for user in ("a*b", "a[1]", 'a"q', "a\\z", "axe"):
        stats.record(keys(user=user, team="acme"), allow())
    assert [row["user"] for row in stats.seen_users("a*")] == ["a*b"]
    assert [row["user"] for row in stats.seen_users("a[")] == ["a[1]"]
    assert [row["user"] for row in stats.seen_users('a"')] == ['a"q']
    assert [row["user"] for row in stats.seen_users("a\\")] == ["a\\z"]
    assert len(stats.seen_users("a")) == 5


def test_users_not_seen_for_longer_than_the_minutes_are_kept_are_forgotten(new_stats, clock):
    stats = new_stats(usage_minutes=HOUR)
    stats.record(keys(user="old"), allow())
    stats.flush()
    clock.advance(HOUR + MINUTE)
    stats.record(keys(user="new"), allow())
    assert [row["user"] for row in stats.seen_users("")] == ["new"]


# --- reservations left open -------------------------------------------------------------------


def test_a_reservation_left_open_past_its_expiry_counts_once_as_expired(new_stats, clock):
    counted = []
    stats = new_stats(on_expired=counted.append)
    stats.reservation_opened("settled", hold=30)
    stats.reservation_opened("forgotten", hold=30)
    stats.flush()
    stats.reservation_settled("settled")
    clock.advance(30 + EXPIRY_GRACE - 1)
    stats.flush()
    assert stats.expired_reservations == 0  # not yet past the grace
    clock.advance(SWEEP_EVERY + 1)
    stats.flush()
    clock.advance(SWEEP_EVERY + 1)
    stats.flush()
    assert (stats.expired_reservations, counted) == (1, [1])


def test_a_reservation_settled_in_the_same_flush_never_reaches_the_store(new_stats, clock):
    stats = new_stats()
    stats.reservation_opened("quick", hold=30)
    stats.reservation_settled("quick")
    clock.advance(60)
    stats.flush()
    assert members(stats, "la:{stats}:res") == [] and stats.expired_reservations == 0


def test_two_workers_sweeping_count_an_expired_reservation_once(redis_url, clock):
    worker_a, worker_b = redis_stats(redis_url, clock), redis_stats(redis_url, clock)
    worker_a.reservation_opened("r1", hold=10)
    worker_a.reservation_opened("r2", hold=10)
    worker_a.flush()
    clock.advance(10 + EXPIRY_GRACE + 1)
    worker_b.flush()
    worker_a.flush()
    assert worker_a.expired_reservations + worker_b.expired_reservations == 2


def test_workers_that_name_a_new_rule_at_once_agree_on_its_short_id(redis_url, clock):
    worker_a, worker_b = redis_stats(redis_url, clock), redis_stats(redis_url, clock)
    for worker in (worker_a, worker_b):
        worker.record(keys(team="acme"), denial("team: gcra(5, 1)"))
    worker_a.flush()
    # worker_b had not seen the name: the id worker_a gave it stands, whoever asks second.
    assert worker_b._new_rule_id("team: gcra(5, 1)") == worker_a._rule_ids({"team: gcra(5, 1)"})["team: gcra(5, 1)"]
    worker_b.flush()
    assert worker_b.usage("acme", HOUR)["blocked_by"] == {"team: gcra(5, 1)": 2}


# --- told what was flushed ---------------------------------------------------------------------


def test_a_flush_tells_on_flush_the_tenants_it_sent_counts_of(new_stats, clock):
    told = []
    stats = new_stats(on_flush=told.append)
    stats.record(keys(user="u1", team="acme"), allow())
    stats.record(keys(user="u2", team="initech"), denial(USER_RULE))
    stats.record({"user": "lone"}, allow())  # no team key: no tenant to tell of
    clock.advance(MINUTE)
    stats.record(keys(user="u1", team="acme"), allow())  # a second minute of the same batch
    stats.flush()
    stats.flush()  # nothing buffered: nothing to tell
    assert told == [frozenset({"acme", "initech"})]


def test_a_failing_on_flush_loses_no_counts(new_stats):
    def broken(tenants):
        raise RuntimeError("the listener's own bug")

    stats = new_stats(on_flush=broken)
    stats.record(keys(user="u1", team="acme"), denial(USER_RULE))
    stats.flush()
    assert stats.usage("acme", 300)["series"][-1]["denied"] == 1


def test_a_flush_that_the_store_refused_tells_nothing_until_it_is_sent(unreachable_redis_url, clock):
    told = []
    stats = redis_stats(unreachable_redis_url, clock, on_flush=told.append)
    stats.record(keys(user="u1", team="acme"), allow())
    stats.flush()
    assert told == []  # kept for the next flush, which tells of it once it is sent


# --- many tenants' denials at once (the alerts' denied shares) ---------------------------------


def test_denials_are_each_tenants_decisions_and_denials_as_usage_counts_them(new_stats, clock):
    stats = new_stats()
    for _ in range(3):
        stats.record(keys(user="u1", team="acme"), allow())
    stats.record(keys(user="u1", team="acme"), denial(USER_RULE))
    stats.record(keys(user="u2", team="initech"), denial(TEAM_RULE))
    clock.advance(16 * MINUTE)  # into the next quarter hour: the window reads two of its hashes
    stats.record(keys(user="u1", team="acme"), denial(USER_RULE))
    found = stats.denials(["acme", "initech", "nobody"], 20 * MINUTE)
    assert found == {"acme": (5, 2), "initech": (1, 1), "nobody": (0, 0)}
    for tenant in ("acme", "initech"):
        series = stats.usage(tenant, 20 * MINUTE)["series"]
        assert found[tenant] == (sum(p["decisions"] for p in series), sum(p["denied"] for p in series))
    assert stats.denials(["acme"], 5 * MINUTE) == {"acme": (1, 1)}  # the window's whole minutes only


def test_denials_of_more_tenants_than_a_round_trip_reads(new_stats, monkeypatch):
    monkeypatch.setattr("core.stats.reports.DENIALS_BATCH", 3)
    stats = new_stats()
    for i in range(7):
        for _ in range(i + 1):
            stats.record(keys(user="u", team=f"t{i}"), denial(USER_RULE) if i % 2 else allow())
    found = stats.denials([f"t{i}" for i in range(7)], 300)
    assert found == {f"t{i}": (i + 1, (i + 1) * (i % 2)) for i in range(7)}


def test_denials_over_a_window_longer_than_the_minutes_kept_are_refused(new_stats):
    with pytest.raises(InvalidRequest):
        new_stats(usage_minutes=HOUR).denials(["acme"], 2 * HOUR)
