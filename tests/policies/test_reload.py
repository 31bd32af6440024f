"""Reload: every worker picks up a committed edit within a second, keeps deciding with the
last good policy while the database is unreachable, and drops expired overrides on time."""

import datetime as dt

import pytest
from django.db import OperationalError, transaction

from policies import compile as compile_module
from policies.compile import PolicyCache, PolicyUnavailable
from policies.models import Level, PolicyVersion, Rule, Tenant, Tier
from policies.signals import current_version
from tests.postgres import Writer, held_open

from .conftest import START

pytestmark = pytest.mark.django_db

KEYS = {"user": "u1", "team": "acme", "global": "*"}


def team_capacity(cache, team="acme"):
    return cache.limiter_for(team).levels["team"][0].capacity


def set_team_capacity(tier_name, capacity):
    rule = Rule.objects.get(tier__name=tier_name, level__name="team")
    rule.params = {**rule.params, "capacity": capacity}
    rule.save()


def test_every_committed_change_bumps_the_version_once(load, policy, commits):
    load(policy)
    before = current_version()
    with commits(), transaction.atomic():
        set_team_capacity("pro", 2000)
        set_team_capacity("free", 200)
    assert current_version() == before + 1


def test_a_rolled_back_change_does_not_bump_the_version(load, policy, commits):
    load(policy)
    before = current_version()
    with commits():
        with pytest.raises(RuntimeError), transaction.atomic():
            set_team_capacity("pro", 2000)
            raise RuntimeError("changed my mind")
    assert current_version() == before


def test_two_workers_pick_up_an_edit_within_a_second(load, policy, worker, clock, commits):
    load(policy)
    first, second = worker(), worker()
    clock.advance(0.3)
    assert team_capacity(first) == team_capacity(second) == 1000

    with commits():
        set_team_capacity("pro", 2000)
    clock.advance(0.1)
    # Within the check interval a worker keeps its policy (no query on a warm decision) ...
    assert team_capacity(second) == 1000
    clock.advance(0.4)
    # ... and at most 0.5 s after the commit every worker has the edit.
    assert team_capacity(first) == team_capacity(second) == 2000


def test_buckets_survive_a_reload(load, policy, worker, clock, commits):
    load(policy)
    cache = worker()
    for _ in range(5):
        assert cache.decide(KEYS, 10).allowed
    with commits():
        Rule.objects.create(
            tier=Tier.objects.get(name="pro"),
            level_id=Rule.objects.first().level_id,
            type="gcra",
            params={"rate": 1000, "burst": 1000},
        )
    clock.advance(0.5)
    # The user's token bucket (50, 10/s) is the same rule, so it is the same, empty, bucket.
    assert cache.decide(KEYS, 10).blocked_by == "user: token_bucket(50, 10/s)"


def test_a_worker_keeps_the_last_good_policy_while_the_database_is_down(load, policy, worker, clock, monkeypatch):
    load(policy)
    cache = worker()
    assert cache.decide(KEYS, 1).allowed

    def database_down():
        raise OperationalError("could not connect to server")

    monkeypatch.setattr(compile_module, "current_version", database_down)
    clock.advance(5)
    assert cache.decide(KEYS, 1).allowed
    assert team_capacity(cache) == 1000


def test_a_worker_that_never_read_a_policy_says_so_when_the_database_is_down(worker, monkeypatch):
    monkeypatch.setattr(compile_module, "read_policy", lambda: (_ for _ in ()).throw(OperationalError("down")))
    with pytest.raises(PolicyUnavailable):
        worker().decide(KEYS, 1)


def test_an_override_stops_applying_at_its_expiry_exactly(load, policy, worker, clock):
    until = START + dt.timedelta(hours=1)
    policy["tenants"]["bigco"]["overrides_until"] = until.isoformat()
    load(policy)
    cache = worker()
    assert team_capacity(cache, "bigco") == 600

    clock.now = until.timestamp() - 1e-3
    assert team_capacity(cache, "bigco") == 600
    clock.now = until.timestamp()
    assert team_capacity(cache, "bigco") == 1000
    assert cache.limiter_for("bigco") is cache.limiter_for("acme")


def test_expiry_needs_no_database_query(load, policy, worker, clock, django_assert_num_queries):
    until = START + dt.timedelta(seconds=0.2)
    policy["tenants"]["bigco"]["overrides_until"] = until.isoformat()
    load(policy)
    cache = worker()
    cache.limiter_for("acme")
    assert team_capacity(cache, "bigco") == 600
    clock.advance(0.2)
    with django_assert_num_queries(0):
        assert team_capacity(cache, "bigco") == 1000


def test_the_cache_knows_the_earliest_upcoming_expiry(load, policy, worker):
    policy["tenants"]["soon"] = {
        "tier": "free",
        "overrides": policy["tenants"]["bigco"]["overrides"],
        "overrides_until": (START + dt.timedelta(minutes=5)).isoformat(),
    }
    policy["tenants"]["past"] = {
        "tier": "free",
        "overrides": policy["tenants"]["bigco"]["overrides"],
        "overrides_until": (START - dt.timedelta(minutes=5)).isoformat(),
    }
    load(policy)
    cache = worker()
    cache.limiter_for("acme")
    assert cache.next_expiry == (START + dt.timedelta(minutes=5)).timestamp()
    assert team_capacity(cache, "past") == 100


def test_overrides_without_an_expiry_apply_for_good(load, policy, worker, clock):
    del policy["tenants"]["bigco"]["overrides_until"]
    load(policy)
    cache = worker()
    clock.advance(10 * 365 * 86400)
    assert team_capacity(cache, "bigco") == 600


def test_a_tenant_moved_to_another_tier_is_served_by_it_after_reload(load, policy, worker, clock, commits):
    load(policy)
    cache = worker()
    assert team_capacity(cache) == 1000
    with commits():
        tenant = Tenant.objects.get(key="acme")
        tenant.tier = Tier.objects.get(name="free")
        tenant.save()
    clock.advance(0.5)
    assert team_capacity(cache) == 100


def test_the_version_row_starts_at_zero():
    assert current_version() == 0
    assert not PolicyVersion.objects.exists()


def test_refresh_checks_at_once(load, policy, worker, commits):
    load(policy)
    cache = worker()
    cache.limiter_for("acme")
    with commits():
        set_team_capacity("pro", 3000)
    cache.refresh()
    assert team_capacity(cache) == 3000
    assert isinstance(cache, PolicyCache)


def create_level(name):
    with transaction.atomic():
        return Level.objects.create(name=name)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_first_two_changes_to_an_empty_store_at_once_each_move_the_version():
    """Both find no version row and create it; the second waits for the first's, fails to
    create its own, and must still count its change."""
    with held_open(Level, "first") as (holding, waited):
        first = Writer("first", lambda: create_level("a"))
        first.start()
        assert holding.wait(30)
        second = Writer("second", lambda: create_level("b"))
        second.start()
        first.outcome(), second.outcome()
    assert waited == [True], "the second change never waited for the first"
    assert current_version() == 2


def test_a_rolled_back_savepoint_takes_the_bump_with_it_and_the_next_write_bumps_again(load, policy, commits):
    load(policy)
    before = current_version()
    with commits(), transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            set_team_capacity("pro", 2000)  # bumps first, then rolls back with it
            raise RuntimeError("changed my mind")
        assert current_version() == before
        set_team_capacity("free", 200)
        set_team_capacity("pro", 3000)
    assert current_version() == before + 1


def test_after_a_rolled_back_transaction_the_next_one_bumps_though_another_bumped_meanwhile(load, policy, commits):
    load(policy)
    before = current_version()
    with pytest.raises(RuntimeError), transaction.atomic():
        set_team_capacity("pro", 2000)
        raise RuntimeError("changed my mind")
    # Another worker's committed change (a bump from `before`, as the rolled-back one was).
    PolicyVersion.objects.filter(pk=1).update(number=before + 1, bumped_by="another-transaction")
    with commits(), transaction.atomic():
        set_team_capacity("free", 200)
    assert current_version() == before + 2
