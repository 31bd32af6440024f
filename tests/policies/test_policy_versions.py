"""Policy versions (PolicyChange, written by policies/signals.py): each version says when it
was made, by whom (an operator, a service token, a command) and what it changed, from the
history records that carry its number; one version per write, however many rows it touches."""

import html
import io
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import transaction
from django.test import Client

from policies.models import Level, PolicyChange, PolicyVersion, Rule, Tenant, Tier
from policies.signals import acting_as, current_version
from tests.api.conftest import make_token, memory_engine, token_client  # noqa: F401  (fixtures)

from .test_admin import tier_form

pytestmark = pytest.mark.django_db

VERSIONS = "/admin/policies/policychange/"


@pytest.fixture
def admin(db):
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("operator", password="pw-for-tests"))
    return client


def text(response) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", response.content.decode())))


def records_of(version: int) -> list:
    return [record for model in (Level, Tier, Tenant, Rule) for record in model.history.filter(policy_version=version)]


def test_a_load_is_one_version_by_the_command_and_tags_every_record_it_made(load, policy):
    with acting_as("loadpolicies demo.yaml"):
        load(policy)
    [change] = PolicyChange.objects.all()
    assert (change.version, change.by, change.user) == (current_version(), "loadpolicies demo.yaml", None)
    made = records_of(change.version)
    assert len(made) == 3 + 2 + 2 + 7  # levels, tiers, tenants, rules
    assert not [m for model in (Level, Tier, Tenant, Rule) for m in model.history.filter(policy_version=None)]


def test_loadpolicies_names_itself_and_its_file_as_the_author(tmp_path, memory_engine):  # noqa: F811
    call_command("loadpolicies", "demo", stdout=io.StringIO())
    assert PolicyChange.objects.get().by == "loadpolicies demo.yaml"


def test_an_admin_save_is_a_version_by_its_operator_with_what_it_changed(admin, load, policy):
    load(policy)
    pro = Tier.objects.get(name="pro")
    rules = list(pro.rules.all())
    rules[0].params = {"limit": 900, "window": 60}
    assert admin.post(f"/admin/policies/tier/{pro.pk}/change/", tier_form(pro, rules=rules)).status_code == 302

    change = PolicyChange.objects.first()  # newest first
    assert (change.version, change.by, change.user.username) == (current_version(), "operator", "operator")
    page = text(admin.get(VERSIONS))
    assert f"{change.version} " in page
    assert "changed tier pro: user: sliding_window limit 600 → 900" in page
    assert "created levels user, team, global; tiers free, pro; tenants acme, bigco; 1 global rule; priority" in page


def test_a_service_tokens_change_names_the_token(load, policy, memory_engine):  # noqa: F811
    load(policy)
    api = token_client(make_token("admin", "ops-script"))
    response = api.patch("/api/v1/levels/team", {"fail_mode": "closed", "version": 1}, format="json")
    assert response.status_code == 200
    change = PolicyChange.objects.first()
    assert (change.by, change.user) == ("token:ops-script", None)
    assert [r.history_object.name for r in records_of(change.version)] == ["team"]


def test_a_change_rolled_back_leaves_no_version(load, policy):
    load(policy)
    before = PolicyChange.objects.count()
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            Tier.objects.create(name="gold")
            raise RuntimeError("the write failed half-way")
    assert PolicyChange.objects.count() == before
    assert not Tier.history.filter(name="gold").exists()


def test_a_write_outside_a_transaction_tags_its_record_with_the_version_it_made(load, policy):
    load(policy)
    team = Level.objects.get(name="team")
    team.fail_mode = "closed"
    team.save()  # autocommit: the bump comes after the record
    record = team.history.latest()
    assert record.policy_version == current_version() == PolicyChange.objects.first().version


def test_a_versions_page_lists_every_change_linked_to_its_history_record(admin, load, policy):
    load(policy)
    change = PolicyChange.objects.get()
    page = admin.get(f"{VERSIONS}{change.pk}/change/").content.decode()
    acme = Tenant.objects.get(key="acme")
    record = acme.history.get()
    assert f'<a href="/admin/policies/tenant/{acme.pk}/history/{record.history_id}/">created tenant acme</a>' in page
    assert "created tier free: user: added token_bucket(10, 1/s); team: added token_bucket(100, 10/s)" in (
        html.unescape(page)
    )


def test_the_versions_list_reads_its_page_in_a_bounded_number_of_queries(
    admin, load, policy, commits, django_assert_max_num_queries
):
    load(policy)
    for capacity in range(20, 30):
        tier = Tier.objects.get(name="free")
        rules = list(tier.rules.all())
        rules[0].params = {"capacity": capacity, "per_second": 1}
        with commits():  # each save in a transaction of its own, committed
            response = admin.post(f"/admin/policies/tier/{tier.pk}/change/", tier_form(tier, rules=rules))
        assert response.status_code == 302
    assert PolicyChange.objects.count() == 11
    with django_assert_max_num_queries(40):
        page = text(admin.get(VERSIONS))
    assert "changed tier free: user: token_bucket capacity 28 → 29" in page


def test_the_version_counter_is_off_the_index_but_still_served(admin, load, policy):
    load(policy)
    index = admin.get("/admin/").content.decode()
    assert 'href="/admin/policies/policychange/"' in index and 'href="/admin/policies/policyversion/"' not in index
    assert admin.get("/admin/policies/policyversion/").status_code == 200
    assert PolicyVersion.objects.get().number == current_version()


def test_versions_cannot_be_added_changed_or_deleted_from_the_admin(admin, load, policy):
    load(policy)
    change = PolicyChange.objects.get()
    assert admin.get(f"{VERSIONS}add/").status_code == 403
    assert admin.post(f"{VERSIONS}{change.pk}/change/", {"by": "someone else"}).status_code == 403
    assert admin.post(f"{VERSIONS}{change.pk}/delete/", {"post": "yes"}).status_code == 403
    assert PolicyChange.objects.get().by == ""
