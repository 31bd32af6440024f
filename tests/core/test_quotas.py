"""The quota rule (core/quotas.py): a budget per calendar period in its own time zone, hard or
soft, or credits that a top-up refills; on every store (memory, Redis, the cluster: `build`).

Time is a ManualClock of epoch seconds: a quota reads the calendar from it."""

import math
import threading
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from core import ConfigError, HierarchicalLimiter, InvalidRequest, MemoryStore
from core.periods import period_bounds
from core.quotas import PERIOD_SLACK
from core.recorder import DECISION, Record
from core.replay import replay
from core.stores.cluster import ClusterStore
from core.stores.redis import RedisStore

from .helpers import move_to, quota, register_lifetime_quota, state_of, token_bucket
from .test_twins import commands_run

TEAM = {"team": "acme"}
BERLIN, NEW_YORK = "Europe/Berlin", "America/New_York"


def at(text, zone="UTC"):
    """Epoch seconds of a local wall-clock time in `zone`."""
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone)).timestamp()


def name_of(limiter, level, index=0):
    return f"{level}: {limiter.levels[level][index].display()}"


# --- hard: up to the limit per period -------------------------------------------------------------


def test_a_hard_quota_admits_its_limit_then_denies_until_the_next_local_day(build, clock):
    move_to(clock, at("2024-03-30T20:00:00", BERLIN))
    limiter = build({"team": [quota(10, "day", timezone=BERLIN)]})
    assert [limiter.acquire(TEAM, 4).allowed for _ in range(3)] == [True, True, False]
    denied = limiter.acquire(TEAM, 3)
    assert (denied.allowed, denied.reason, denied.blocked_by) == (False, "QUOTA_EXCEEDED", name_of(limiter, "team"))
    assert denied.retry_after == 4 * 3600  # Berlin's midnight
    assert limiter.acquire(TEAM, 2).allowed and limiter.acquire(TEAM, 2).retry_after == 4 * 3600
    move_to(clock, at("2024-03-31T00:00:00", BERLIN))  # a new day starts from nothing...
    assert [limiter.acquire(TEAM, 5).allowed for _ in range(3)] == [True, True, False]
    # ...a day of 23 hours: the clocks go forward at 02:00.
    assert limiter.acquire(TEAM, 1).retry_after == 23 * 3600


def test_a_quota_denies_what_is_over_by_the_tick_and_admits_what_fits_exactly(build, clock):
    move_to(clock, at("2024-05-01T12:00:00"))
    limiter = build({"team": [quota(3, "hour")]})
    assert limiter.acquire(TEAM, 1.5).allowed and limiter.acquire(TEAM, 1.5).allowed
    assert limiter.acquire(TEAM, 1e-6).retry_after == 3600
    move_to(clock, at("2024-05-01T12:59:59.999"))
    assert limiter.acquire(TEAM, 1e-6).retry_after == pytest.approx(0.001, abs=1e-6)  # epoch doubles
    move_to(clock, at("2024-05-01T13:00:00"))
    assert limiter.acquire(TEAM, 3).allowed


def test_a_cost_larger_than_the_limit_never_fits(build, clock):
    limiter = build({"team": [quota(10, "month")]})
    decision = limiter.acquire(TEAM, 11)
    assert (decision.allowed, decision.retry_after, decision.reason) == (False, math.inf, "COST_EXCEEDS_LIMIT")


def test_a_quota_reports_its_own_label_when_given_one(build):
    limiter = build({"team": [quota(1, "week", label="MONTHLY_TOKENS")]})
    limiter.acquire(TEAM)
    assert limiter.acquire(TEAM).reason == "MONTHLY_TOKENS"


def test_the_hour_repeated_when_the_clocks_go_back_is_two_periods(build, clock):
    move_to(clock, at("2024-11-03T01:30:00", NEW_YORK))  # the first 01:30, EDT
    limiter = build({"team": [quota(1, "hour", timezone=NEW_YORK)]})
    assert limiter.acquire(TEAM).allowed and limiter.acquire(TEAM).retry_after == 1800
    clock.advance(1800)  # 01:00 again, EST: another hour
    assert limiter.acquire(TEAM).allowed and not limiter.acquire(TEAM).allowed


def test_a_week_is_an_iso_week_across_the_year_end(build, clock):
    move_to(clock, at("2024-12-31T09:00:00"))  # Tuesday of ISO week 1 of 2025
    limiter = build({"team": [quota(2, "week")]})
    assert [limiter.acquire(TEAM).allowed for _ in range(3)] == [True, True, False]
    move_to(clock, at("2025-01-05T23:59:59"))  # the same week, another year
    assert limiter.acquire(TEAM).retry_after == 1
    move_to(clock, at("2025-01-06T00:00:00"))
    assert limiter.acquire(TEAM).allowed


def test_a_month_is_its_own_length_and_starts_afresh_on_the_first(build, clock):
    move_to(clock, at("2024-02-29T23:00:00", "Asia/Kolkata"))  # a leap year's last day of February
    limiter = build({"team": [quota(1, "month", timezone="Asia/Kolkata")]})
    assert limiter.acquire(TEAM).allowed and limiter.acquire(TEAM).retry_after == 3600
    move_to(clock, at("2024-03-01T00:00:00", "Asia/Kolkata"))
    assert limiter.acquire(TEAM).allowed


def test_two_clocks_astride_a_boundary_do_not_reset_each_others_count(build, clock):
    # A worker whose clock is ahead wrote the new period; one still behind counts into it
    # rather than starting its own period afresh and throwing the other's count away.
    move_to(clock, at("2024-05-02T00:00:01"))
    limiter = build({"team": [quota(2, "day")]})
    assert limiter.acquire(TEAM).allowed
    move_to(clock, at("2024-05-01T23:59:59"))
    assert limiter.acquire(TEAM).allowed and not limiter.acquire(TEAM).allowed
    move_to(clock, at("2024-05-02T00:00:02"))
    assert not limiter.acquire(TEAM).allowed


def test_a_watermark_keeps_a_share_of_a_quota_in_reserve(build, clock):
    limiter = build({"team": [quota(10, "day")]}, priorities={"batch": {"watermark": 0.5, "levels": ["team"]}})
    assert sum(limiter.acquire(TEAM, 1, "batch").allowed for _ in range(8)) == 5
    assert sum(limiter.acquire(TEAM).allowed for _ in range(8)) == 5


# --- soft: past the limit, named ------------------------------------------------------------------


def test_a_soft_quota_admits_past_its_limit_and_names_itself_when_a_request_takes_it_over(build, clock):
    limiter = build({"team": [quota(3, "day", mode="soft"), token_bucket(100, 0)]})
    soft = name_of(limiter, "team")
    decisions = [limiter.acquire(TEAM, 1) for _ in range(5)]
    assert all(d.allowed for d in decisions)
    assert [d.over_quota for d in decisions] == [(), (), (), (soft,), (soft,)]
    assert [d.remaining for d in decisions] == [99, 98, 97, 96, 95]  # the enforced rules' room
    assert state_of(limiter, "team", "acme") == {
        "used": 5.0,
        "limit": 3.0,
        "remaining": -2.0,
        "period_start": 0.0,
        "resets_at": 86400.0,
        "mode": "soft",
        "period": "day",
        "timezone": "UTC",
    }
    assert limiter.acquire(TEAM, 50).over_quota == (soft,)  # far past its limit: still taken
    assert limiter.acquire(TEAM).as_dict()["over_quota"] == (soft,)


def test_a_request_that_takes_a_soft_quota_exactly_to_its_limit_is_not_over(build):
    limiter = build({"team": [quota(3, "day", mode="soft")]})
    assert limiter.acquire(TEAM, 2).over_quota == () and limiter.acquire(TEAM, 1).over_quota == ()
    assert limiter.acquire(TEAM, 0.5).over_quota == (name_of(limiter, "team"),)


def test_a_denial_takes_nothing_from_a_soft_quota_and_names_it_nowhere(build):
    limiter = build({"team": [quota(1, "day", mode="soft"), token_bucket(2, 0)]})
    assert limiter.acquire(TEAM, 2).over_quota == (name_of(limiter, "team"),)
    denied = limiter.acquire(TEAM, 1)
    assert not denied.allowed and denied.over_quota == ()
    assert state_of(limiter, "team", "acme")["used"] == 2


def test_explain_names_the_soft_quotas_a_request_would_take_over(build):
    limiter = build({"team": [quota(3, "day", mode="soft")]})
    limiter.acquire(TEAM, 2)
    assert limiter.explain(TEAM, 1)[0].over_quota == ()
    decision, rows = limiter.explain(TEAM, 2)
    assert decision.allowed and decision.over_quota == (name_of(limiter, "team"),)
    assert rows[0]["wait"] == 0.0 and rows[0]["remaining"] == 1.0


def test_a_soft_quota_with_demote_to_decides_a_request_over_it_under_that_class(build):
    priorities = {"batch": {"watermark": 0.5, "levels": ["global"]}}
    config = {"team": [quota(3, "day", mode="soft", demote_to="batch")], "global": [token_bucket(10, 0)]}
    limiter = build(config, priorities=priorities)
    keys = {"team": "acme", "global": "*"}
    # Within the quota: all of the global bucket; past it, only above batch's watermark.
    assert all(limiter.acquire(keys).allowed for _ in range(3))
    assert [limiter.acquire(keys).allowed for _ in range(3)] == [True, True, False]
    denied = limiter.acquire(keys)
    assert denied.blocked_by == name_of(limiter, "global") and denied.remaining == 5
    assert limiter.explain(keys)[0].allowed is False  # explain demotes alike
    # Another team, within its quota, takes from below the watermark, until it is over too.
    other = {"team": "other", "global": "*"}
    assert [limiter.acquire(other).allowed for _ in range(4)] == [True, True, True, False]


def test_a_demoted_request_is_reserved_under_that_class_too(build):
    priorities = {"batch": {"watermark": 0.5, "levels": ["global"]}}
    config = {"team": [quota(1, "day", mode="soft", demote_to="batch")], "global": [token_bucket(10, 0)]}
    limiter = build(config, priorities=priorities)
    keys = {"team": "acme", "global": "*"}
    decision, _ = limiter.reserve(keys, 5)
    assert decision.allowed and decision.over_quota == (name_of(limiter, "team"),)
    decision, reservation = limiter.reserve(keys, 1)
    assert not decision.allowed and reservation is None


# --- reservations: held, settled exactly ------------------------------------------------------------


def test_a_reservation_holds_its_estimate_and_settles_to_its_actual_cost(build, clock):
    limiter = build({"team": [quota(100, "day")]})
    _, reservation = limiter.reserve(TEAM, 60)
    assert state_of(limiter, "team", "acme")["used"] == 60
    assert not limiter.acquire(TEAM, 41).allowed
    settlement = limiter.settle(reservation.id, 25)
    assert (settlement.refunded, settlement.charged) == (35, 0)
    assert state_of(limiter, "team", "acme")["used"] == 25
    assert limiter.acquire(TEAM, 75).allowed and not limiter.acquire(TEAM, 1).allowed


def test_a_charge_past_what_was_left_is_taken_and_the_overspend_denies_until_the_next_period(build, clock):
    move_to(clock, at("2024-05-01T10:00:00"))
    limiter = build({"team": [quota(100, "day")]})
    _, reservation = limiter.reserve(TEAM, 90)
    assert limiter.settle(reservation.id, 130).charged == 40
    state = state_of(limiter, "team", "acme")
    assert (state["used"], state["remaining"]) == (130, -30)
    denied = limiter.acquire(TEAM, 1)
    assert not denied.allowed and denied.retry_after == 14 * 3600 and denied.remaining == 0
    move_to(clock, at("2024-05-02T00:00:00"))
    assert limiter.acquire(TEAM, 100).allowed


def test_a_refund_after_the_period_ended_gives_nothing_to_the_new_one(build, clock):
    move_to(clock, at("2024-05-01T23:59:00"))
    limiter = build({"team": [quota(100, "day")]})
    _, reservation = limiter.reserve(TEAM, 50, hold=600)
    move_to(clock, at("2024-05-02T00:01:00"))
    limiter.acquire(TEAM, 10)
    assert limiter.settle(reservation.id, 20).refunded == 30
    assert state_of(limiter, "team", "acme")["used"] == 10  # the refund was the old day's
    _, later = limiter.reserve(TEAM, 40, hold=600)
    limiter.settle(later.id, 45)
    assert state_of(limiter, "team", "acme")["used"] == 55


# --- credits: a balance that only a top-up refills ---------------------------------------------------


def test_credits_are_denied_forever_once_spent_until_a_top_up(build, clock):
    limiter = build({"team": [quota(5, "none", label="NO_CREDITS")]})
    assert limiter.acquire(TEAM, 5).allowed
    denied = limiter.acquire(TEAM, 1)
    assert (denied.reason, denied.retry_after) == ("NO_CREDITS", math.inf)
    clock.advance(400 * 86400)
    assert not limiter.acquire(TEAM, 1).allowed
    assert limiter.top_up("team", "acme", "NO_CREDITS", 3) == 3
    assert limiter.acquire(TEAM, 3).allowed and not limiter.acquire(TEAM, 0.5).allowed


def test_credits_topped_up_past_the_limit_take_a_cost_larger_than_the_limit(build):
    limiter = build({"team": [quota(10, "none")]})
    assert limiter.top_up("team", "acme", 0, 15) == 25
    assert limiter.acquire(TEAM, 20).allowed
    assert state_of(limiter, "team", "acme") == {
        "used": 5.0,
        "limit": 10.0,
        "remaining": 5.0,
        "period_start": None,
        "resets_at": None,
        "mode": "hard",
        "period": "none",
        "timezone": "UTC",
    }
    assert limiter.acquire(TEAM, 6).retry_after == math.inf


def test_a_top_up_of_an_overspent_balance_pays_the_debt_first(build):
    limiter = build({"team": [quota(10, "none")]})
    _, reservation = limiter.reserve(TEAM, 10)
    limiter.settle(reservation.id, 16)
    assert limiter.top_up("team", "acme", 0, 4) == -2
    assert not limiter.acquire(TEAM, 1e-3).allowed
    assert limiter.top_up("team", "acme", 0, 2.5) == 0.5 and limiter.acquire(TEAM, 0.5).allowed


def test_a_top_up_names_the_quota_by_its_label_or_its_index_among_the_levels_rules(build):
    config = {"team": [token_bucket(5, 1), quota(10, "none", label="CREDITS"), quota(20, "day")]}
    limiter = build(config)
    assert limiter.top_up("team", "acme", "CREDITS", 1) == 11
    assert limiter.top_up("team", "acme", 1, 1.5) == 12.5
    assert limiter.top_up("team", "other", 1, 1) == 11  # each key its own balance


@pytest.mark.parametrize(
    ("call", "field", "words"),
    [
        (("teams", "acme", 0, 1), "level", "unknown level 'teams'"),
        (("team", "", 0, 1), "key", "non-empty string"),
        (("team", "acme", 0, 1), "rule", "takes no top-up: only a quota with period none does"),
        (("team", "acme", 2, 1), "rule", "takes no top-up"),
        (("team", "acme", 3, 1), "rule", r"no rule 3 at this level \(it has 3\)"),
        (("team", "acme", "MISSING", 1), "rule", "no rule is labelled 'MISSING'"),
        (("team", "acme", True, 1), "rule", "label or its index"),
        (("team", "acme", 1, 0), "amount", "greater than 0"),
        (("team", "acme", 1, -5), "amount", "greater than 0"),
        (("team", "acme", 1, math.nan), "amount", "greater than 0"),
        (("team", "acme", 1, math.inf), "amount", "greater than 0"),
        (("team", "acme", 1, "10"), "amount", "must be a number, not str"),
        (("team", "acme", 1, True), "amount", "must be a number, not bool"),
    ],
)
def test_a_top_up_is_refused_naming_the_field(build, call, field, words):
    limiter = build({"team": [token_bucket(5, 1), quota(10, "none"), quota(20, "day")]})
    with pytest.raises(InvalidRequest, match=words) as refused:
        limiter.top_up(*call)
    assert refused.value.field == field


def test_a_top_up_that_names_two_rules_by_their_label_is_refused(build):
    limiter = build({"team": [quota(10, "none", label="X"), quota(5, "day", label="X")]})
    with pytest.raises(InvalidRequest, match="2 rules are labelled 'X'"):
        limiter.top_up("team", "acme", "X", 1)


# --- reading a quota --------------------------------------------------------------------------------


def test_inspect_shows_a_quotas_period_in_its_time_zone(build, clock):
    move_to(clock, at("2024-10-27T12:00:00", BERLIN))
    limiter = build({"team": [quota(1000, "day", timezone=BERLIN, mode="soft")]})
    limiter.acquire(TEAM, 250)
    [row] = limiter.inspect("team", "acme")
    assert row["rule"] == "quota(1000/day Europe/Berlin, soft)" and row["label"] == "QUOTA_EXCEEDED"
    assert row["state"] == {
        "used": 250.0,
        "limit": 1000.0,
        "remaining": 750.0,
        "period_start": at("2024-10-27T00:00:00", BERLIN),
        "resets_at": at("2024-10-28T00:00:00", BERLIN),  # 25 hours later
        "mode": "soft",
        "period": "day",
        "timezone": BERLIN,
    }
    assert limiter.inspect("team", "nobody")[0]["state"]["used"] == 0.0


# --- configuration ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "path", "words"),
    [
        (quota(10, "day", timezone="Mars/Olympus"), "team[0].timezone", "unknown time zone 'Mars/Olympus'"),
        (quota(10, "day", timezone=""), "team[0].timezone", "known names, such as"),
        (quota(10, "fortnight"), "team[0].period", "must be one of hour, day, week, month, none"),
        ({"type": "quota", "limit": 10}, "team[0].period", "is required"),
        (quota(0, "day"), "team[0].limit", "greater than 0"),
        (quota(10, "day", mode="gentle"), "team[0].mode", "must be one of hard, soft"),
    ],
)
def test_a_bad_quota_is_refused_naming_its_field(spec, path, words):
    with pytest.raises(ConfigError, match=words) as refused:
        HierarchicalLimiter.from_config({"team": [spec]})
    assert refused.value.path == path


def test_demote_to_must_name_one_of_the_limiters_priority_classes():
    config = {"user": [token_bucket(1, 1)], "team": [quota(10, "day", mode="soft", demote_to="bulk")]}
    with pytest.raises(ConfigError, match=r"unknown priority class 'bulk' \(known: batch\)") as refused:
        HierarchicalLimiter.from_config(config, priorities={"batch": {"watermark": 0.5}})
    assert refused.value.path == "team[0].demote_to"
    assert HierarchicalLimiter.from_config(config, priorities={"bulk": {"watermark": 0.5}})


def test_a_quotas_state_is_named_by_what_it_counts_not_the_limit_it_is_held_to(build):
    # A raised (or lowered) limit keeps what was used in the period: an operator who gives a
    # tenant more budget mid-month does not give it the month again. So does a new starting
    # balance for credits (a top-up is never lost to an edit). A hard and a soft quota of the
    # same period count apart (a warning below the cap); two of one mode are one budget.
    store_limiter = build({"team": [quota(10, "day"), quota(5, "none")]})
    store_limiter.acquire(TEAM, 4)
    store = store_limiter.store
    raised = HierarchicalLimiter.from_config(
        {"team": [quota(20, "day"), quota(8, "none")]}, store=store, clock=store_limiter.clock
    )
    assert [row["state"]["used"] for row in raised.inspect("team", "acme")] == [4, 4]
    assert [row["state"]["remaining"] for row in raised.inspect("team", "acme")] == [16, 4]
    soft = HierarchicalLimiter.from_config(
        {"team": [quota(10, "day", mode="soft")]}, store=store, clock=store_limiter.clock
    )
    assert soft.inspect("team", "acme")[0]["state"]["used"] == 0
    assert HierarchicalLimiter.from_config({"team": [quota(10, "day"), quota(8, "day", mode="soft")]})
    with pytest.raises(ConfigError) as repeated:
        HierarchicalLimiter.from_config({"team": [quota(10, "day"), quota(20, "day")]})
    # The message names the rule repeated (not the repeat) and why two limits are one budget.
    assert str(repeated.value) == (
        "team[1]: repeats rule 0 (quota(10/day)) of this level: quotas of the same period, time zone "
        "and mode that count the same are one budget, whatever their limits, labels and demote_to"
    )


# --- wall time, where the store's clock is not a calendar ----------------------------------------------


def test_with_no_clock_injected_the_in_process_store_hands_a_quota_the_wall_clock():
    limiter = HierarchicalLimiter.from_config({"team": [quota(10, "hour"), token_bucket(5, 0)]}, store=MemoryStore())
    assert limiter.acquire(TEAM, 2).allowed
    state = state_of(limiter, "team", "acme")
    start, end = period_bounds("hour", "UTC", datetime.now().timestamp())
    assert (state["period_start"], state["resets_at"]) in {(start, end), (start - 3600, start)}
    assert state_of(limiter, "team", "acme", 1)["tokens"] == 3  # the bucket on the monotonic clock


def test_a_quotas_state_goes_idle_at_the_end_of_its_period_and_credits_never(clock):
    store = MemoryStore()
    move_to(clock, at("2024-05-01T10:00:00"))
    limiter = HierarchicalLimiter.from_config({"team": [quota(10, "day"), quota(5, "none")]}, store=store, clock=clock)
    limiter.acquire(TEAM)
    move_to(clock, at("2024-05-02T00:00:00") + PERIOD_SLACK)
    assert store.sweep(clock()) == 1 and len(store) == 1  # the day's count went; the balance stays
    assert limiter.inspect("team", "acme")[1]["state"]["used"] == 1
    assert limiter.top_up("team", "acme", 1, 1) == 5 and len(store) == 0  # a fresh balance: no state


def test_a_quota_in_a_replay_sees_the_calendar_time_of_the_records():
    class Policy:
        def route(self, team_key, now):
            return "tier"

        def limiter(self, route, store, clock):
            config = {"team": [quota(2, "day", timezone=BERLIN)]}
            return HierarchicalLimiter.from_config(config, store=store, clock=clock)

        def next_expiry(self, now):
            return math.inf

    midnight = at("2024-05-02T00:00:00", BERLIN)
    records = [Record(midnight - 60 + i, DECISION, TEAM) for i in range(3)]
    records += [Record(midnight + i, DECISION, TEAM) for i in range(3)]
    blocked = "team: quota(2/day Europe/Berlin)"
    assert replay(records, Policy(), midnight - 3600) == [None, None, blocked, None, None, blocked]


# --- on Redis and the cluster: one call, the period handed in, a TTL to the period's end -------------


@pytest.fixture(params=["redis", "cluster"])
def remote(request):
    """(a fresh store on Redis or on the cluster, the redis-servers it decides on)."""
    if request.param == "redis":
        store = RedisStore(url=request.getfixturevalue("redis_url"), timeout=1.0)
        servers = [request.getfixturevalue("redis_server")]
    else:
        url = request.getfixturevalue("redis_cluster_url")
        store = ClusterStore(url=url, timeout=1.0, shards=1, global_mode="split")
        servers = request.getfixturevalue("redis_cluster_servers").primaries()
    yield store, servers
    store.close()


def key_of(limiter, level, key, index=0):
    """The Redis key of one rule's state, and a client of the server that holds it."""
    store = limiter.store
    plan = limiter._plan({level: key}, None).store_plan
    name = plan.keys[index]  # a Redis plan's, or (split mode) a cluster shard's
    client = store.client if isinstance(store, RedisStore) else store.store_of(name).client
    return name, client


def test_on_redis_a_quota_decision_is_one_call_with_the_period_in_its_arguments(remote, clock):
    store, servers = remote
    move_to(clock, at("2024-05-01T10:00:00"))
    limiter = HierarchicalLimiter.from_config(
        {"team": [quota(5, "day", timezone=BERLIN)], "user": [token_bucket(10, 1)]}, store=store, clock=clock
    )
    keys = {"user": "u", "team": "acme"}
    limiter.acquire(keys)  # loads the library where it goes
    for server in servers:
        server.client().config_resetstat()
    assert [limiter.acquire(keys).allowed for _ in range(5)] == [True] * 4 + [False]
    counts = commands_run(servers)
    assert counts.get("fcall") == 5 and not {"watch", "multi", "exec"} & set(counts)


def test_a_plan_without_a_quota_keeps_its_spec_and_one_with_one_writes_the_period_in_per_call(redis_url, clock):
    store = RedisStore(url=redis_url, timeout=1.0)
    limiter = HierarchicalLimiter.from_config(
        {"user": [token_bucket(10, 1)], "team": [quota(5, "day", timezone=BERLIN)]}, store=store, clock=clock
    )
    plain = limiter._plan({"user": "u"}, None).store_plan
    assert plain.timed == () and plain.spec_at(clock()) == plain.spec
    with_quota = limiter._plan({"user": "u", "team": "acme"}, None).store_plan
    start, end = period_bounds("day", BERLIN, clock())
    assert with_quota.spec_at(clock()).endswith(f" quota 0.0 0 0 5.0,0.0,0.0,{start!r},{end!r}")
    store.close()


def test_on_redis_a_periods_state_expires_after_its_period_and_a_balance_never(remote, clock):
    store, _ = remote
    move_to(clock, at("2024-05-01T23:00:00"))
    limiter = HierarchicalLimiter.from_config({"team": [quota(5, "day"), quota(5, "none")]}, store=store, clock=clock)
    limiter.acquire(TEAM)
    day, client = key_of(limiter, "team", "acme", 0)
    credits, _ = key_of(limiter, "team", "acme", 1)
    assert (3600 + PERIOD_SLACK) * 1000 < client.pttl(day) <= (3600 + PERIOD_SLACK + 1) * 1000
    assert client.pttl(credits) == -1  # no TTL
    assert limiter.top_up("team", "acme", 1, 1) == 5 and client.exists(credits) == 0  # fresh: no state


def test_on_redis_with_no_clock_injected_the_period_is_this_processs_and_the_time_the_servers(remote):
    store, _ = remote
    limiter = HierarchicalLimiter.from_config({"team": [quota(3, "hour"), quota(10, "none")]}, store=store)
    assert [limiter.acquire(TEAM).allowed for _ in range(4)] == [True, True, True, False]
    denied = limiter.acquire(TEAM)
    now = datetime.now().timestamp()
    assert 0 < denied.retry_after <= period_bounds("hour", "UTC", now)[1] - now + 1
    state = state_of(limiter, "team", "acme")
    assert state["used"] == 3 and state["period_start"] in {period_bounds("hour", "UTC", now)[0], now // 3600 * 3600}
    assert limiter.top_up("team", "acme", 1, 2) == 9
    _, reservation = limiter.reserve(TEAM, 1)
    assert reservation is None  # the hour is spent


# --- exact under threads -----------------------------------------------------------------------------


@pytest.mark.memory_only
@pytest.mark.usefixtures("frequent_thread_switches")
@pytest.mark.parametrize("period", ["month", "none"])
def test_200_threads_reserving_settling_topping_up_and_spending_leave_a_quota_exactly_spent(build, period):
    limit, threads = 200, 200
    limiter = build({"team": [quota(limit, period)]})
    held, charged, spent, topped_up = {}, [], [], []

    def reserve(n):
        decision, reservation = limiter.reserve(TEAM, 4)  # 800 asked of 200: exactly 50 fit
        if reservation is not None:
            held[n] = reservation

    def settle(n):
        if n in held:  # above and below the estimate of 4
            actual = (1.0, 5.0, 7.5)[n % 3]
            limiter.settle(held[n].id, actual)
            charged.append(actual)

    def spend(n):
        if period == "none" and n % 2 == 0:
            limiter.top_up("team", "acme", 0, 1.5)
            topped_up.append(1.5)
        spent.append(limiter.acquire(TEAM).allowed)

    for work in (reserve, settle, spend):
        start = threading.Barrier(threads)
        workers = [
            threading.Thread(target=lambda n=n, work=work, start=start: (start.wait(), work(n))) for n in range(threads)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    assert len(held) == 50
    state = state_of(limiter, "team", "acme")
    assert state["used"] == sum(charged) + sum(spent) - sum(topped_up)
    rest = 0
    while limiter.acquire(TEAM).allowed:
        rest += 1
    if sum(charged) >= limit and period == "month":
        assert sum(spent) == rest == 0 and state_of(limiter, "team", "acme")["remaining"] == limit - sum(charged)
    else:  # spent to the last whole unit (a spend is 1), none twice
        left = state_of(limiter, "team", "acme")["remaining"]
        assert 0 <= left < 1 and sum(charged) + sum(spent) + rest + left == limit + sum(topped_up)


def test_beside_a_plug_in_without_a_twin_a_quota_is_kept_as_its_twin_keeps_it(redis_url, clock, plugin_name):
    # The optimistic path writes the quota's state from Python; its Lua then reads it.
    lifetime = plugin_name("lifetime")
    register_lifetime_quota(lifetime)
    move_to(clock, at("2024-05-01T23:00:00"))
    store = RedisStore(url=redis_url, timeout=1.0)
    config = {"team": [{"type": lifetime, "total": 100}, quota(3, "day"), quota(2, "none")]}
    both = HierarchicalLimiter.from_config(config, store=store, clock=clock)
    alone = HierarchicalLimiter.from_config({"team": config["team"][1:]}, store=store, clock=clock)
    assert both._plan(TEAM, None).store_plan.optimistic
    assert both.acquire(TEAM).allowed  # optimistic: WATCH, Python, MULTI/EXEC
    assert alone.acquire(TEAM).allowed and not alone.acquire(TEAM).allowed  # the Lua: 2 credits spent
    day, client = key_of(alone, "team", "acme", 0)
    credits, _ = key_of(alone, "team", "acme", 1)
    assert client.get(day) == b"1714521600 2"  # the period's start and what it used, as the Lua wrote them
    assert (3600 + PERIOD_SLACK) * 1000 < client.pttl(day) and client.pttl(credits) == -1
    assert both.top_up("team", "acme", 2, 1) == 1 and alone.top_up("team", "acme", 1, 1) == 2
    assert [row["state"]["used"] for row in both.inspect("team", "acme")[1:]] == [2, 0]
    store.close()


@pytest.mark.memory_only
def test_in_process_a_soft_quota_is_decided_on_the_compiled_path_and_named_by_it(build):
    limiter = build({"team": [token_bucket(10, 0), quota(1, "day", mode="soft"), quota(5, "day")]})
    plan = limiter._plan(TEAM, None)
    assert plan.store_plan.lean is not None and plan.lean_max_cost > 0  # no demotion: the lean path
    assert limiter.acquire(TEAM).over_quota == ()
    taken_over = limiter.acquire(TEAM)
    assert taken_over.over_quota == (name_of(limiter, "team", 1),) and taken_over.remaining == 3


def test_what_a_quota_cannot_do_with_its_mode_is_inert_not_refused(build):
    """Every rule the API's schema describes is one the engine builds: demote_to on a hard
    quota has no one to demote, shadow on a soft one nothing to add."""
    hard = build({"team": [quota(10, "day", demote_to="batch")]}, priorities={"batch": {"watermark": 0.5}})
    assert hard.levels["team"][0].demote_to is None
    assert [hard.acquire(TEAM, 6).allowed, hard.acquire(TEAM, 6).allowed] == [True, False]
    soft = build({"team": [quota(10, "day", mode="soft", shadow=True)]})
    assert soft.levels["team"][0].shadow is False
    soft.acquire(TEAM, 6)
    assert soft.acquire(TEAM, 6).over_quota == ("team: quota(10/day, soft)",)
