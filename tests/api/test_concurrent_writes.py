"""Two writers at the same moment, on PostgreSQL, for real: each in a thread of its own with
its own connection, the first holding its transaction open until the second is blocked
behind one of its locks (pg_locks shows it). Whatever the order, the loser gets the 409 that
optimistic locking promises, never a deadlock or a 503, and the policy version moves once.

SQLite takes one lock for the whole database, so none of this can happen there; the same
races, simulated in one thread, are in test_crud.py and run on both databases.
"""

from __future__ import annotations

import copy

import pytest

from policies.models import Level, Tenant, Tier
from policies.policyfile import load_policy
from policies.signals import current_version
from tests.policies.conftest import POLICY
from tests.postgres import Writer, held_open

from .conftest import make_token, token_client

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

GOLD = {"user": [{"type": "token_bucket", "capacity": 5, "per_second": 1}]}
SILVER = {"user": [{"type": "token_bucket", "capacity": 3, "per_second": 1}]}


@pytest.fixture
def client(memory_engine):
    """An operator's script on SPEC.md's example policy, committed."""
    load_policy(copy.deepcopy(POLICY))
    return token_client(make_token("admin", "ops-script"))


def test_two_operators_saving_one_tier_at_once_one_wins_and_the_other_gets_a_409(client):
    before = current_version()
    with held_open(Tier, "first") as (holding, waited):
        first = Writer(
            "first",
            lambda: client.put("/api/v1/tiers/pro", {"name": "pro", "rules": GOLD, "version": 1}, format="json"),
        )
        first.start()
        assert holding.wait(30)
        second = Writer(
            "second",
            lambda: client.put("/api/v1/tiers/pro", {"name": "pro", "rules": SILVER, "version": 1}, format="json"),
        )
        second.start()
        won, lost = first.outcome(), second.outcome()
    assert waited == [True], "the second save never waited for the first"
    assert won.status_code == 200, won.content
    assert won.json()["version"] == 2
    assert lost.status_code == 409, lost.content
    assert "changed since" in lost.json()["error"]["message"]
    assert client.get("/api/v1/tiers/pro").json() == {"name": "pro", "rules": GOLD, "version": 2}
    assert current_version() == before + 1


def test_two_operators_creating_one_name_at_once_one_wins_and_the_other_gets_a_409(client):
    before = current_version()
    with held_open(Tier, "first") as (holding, waited):
        first = Writer("first", lambda: client.post("/api/v1/tiers", {"name": "gold", "rules": GOLD}, format="json"))
        first.start()
        assert holding.wait(30)
        second = Writer(
            "second", lambda: client.post("/api/v1/tiers", {"name": "gold", "rules": SILVER}, format="json")
        )
        second.start()
        won, lost = first.outcome(), second.outcome()
    assert waited == [True], "the second create never waited for the first"
    assert won.status_code == 201, won.content
    assert lost.status_code == 409, lost.content
    assert lost.json()["error"]["code"] == "conflict"
    assert client.get("/api/v1/tiers/gold").json()["rules"] == GOLD
    assert Tier.objects.filter(name="gold").count() == 1
    assert current_version() == before + 1


def test_a_load_and_an_edit_at_the_same_time_wait_for_each_other_and_never_deadlock(client):
    """The load changes a level first (the policy version's row is then locked), then the
    tenant the edit is saving. Had the edit locked the tenant's row before waiting for the
    version's, each would wait for the other: PostgreSQL breaks a deadlock by failing one."""
    before = current_version()
    doc = copy.deepcopy(POLICY)
    doc["levels"][0]["fail_mode"] = "closed"
    doc["tenants"]["acme"]["tier"] = "free"
    with held_open(Level, "load") as (holding, waited):
        load = Writer("load", lambda: load_policy(doc))
        load.start()
        assert holding.wait(30)
        edit = Writer(
            "edit",
            lambda: client.patch(
                "/api/v1/tenants/acme", {"overrides_until": "2027-01-01T00:00:00Z", "version": 1}, format="json"
            ),
        )
        edit.start()
        load.outcome()
        answer = edit.outcome()
    assert waited == [True], "the edit never waited for the load"
    assert answer.status_code == 409, answer.content
    assert "changed since" in answer.json()["error"]["message"]
    acme = Tenant.objects.get(key="acme")
    assert (acme.tier.name, acme.overrides_until) == ("free", None)
    assert Level.objects.get(name="user").fail_mode == "closed"
    assert current_version() == before + 1
