"""The admin index's recent actions as sentences (limiter_admin/actions.py): a policy change
worded from its history record, a console action (a reset, a quick raise) from its own
sentence with a link to its tenant, anything else from Django's own message."""

import re

from django.contrib.auth import get_user_model

from policies.models import Tenant, Tier
from tests.dashboard.conftest import DASHBOARD, text
from tests.policies.test_admin import tier_form

from .test_tenant_page import PRO_TEAM, RAISE, raise_form


def recent_actions(console) -> list[str]:
    """The index's recent actions, newest first, as HTML (to see the links)."""
    html = console.get("/admin/").content.decode()
    box = html[html.index('id="recent-actions-module"') :]
    return [
        re.sub(r"\s+", " ", item).strip() for item in re.findall(r'<li class="[^"]*recent-action">(.*?)<br>', box, re.S)
    ]


def test_a_tiers_change_reads_as_its_diff_linking_the_tier(api, console):
    pro = Tier.objects.get(name="pro")
    rules = list(pro.rules.all())
    rules[1].params = {"capacity": 60, "per_second": 10}
    assert console.post(f"/admin/policies/tier/{pro.pk}/change/", tier_form(pro, rules=rules)).status_code == 302
    [action] = recent_actions(console)
    assert action == (
        f'Changed tier <a href="/admin/policies/tier/{pro.pk}/change/">pro</a>: user: token_bucket capacity 50 → 60'
    )


def test_a_reset_reads_as_a_sentence_naming_the_key_as_team_and_user(api, console):
    console.post(DASHBOARD + "reset/", {"level": "user", "key": "alice", "team": "acme"})
    console.post(DASHBOARD + "reset/", {"level": "global", "key": "*", "team": ""})
    assert recent_actions(console) == [
        "Reset the buckets of global: *",
        'Reset the buckets of <a href="/admin/dashboard/tenants/acme/">acme / alice</a>',
    ]


def test_a_quick_raise_reads_as_a_sentence_linking_the_tenant_page(api, console):
    console.post(RAISE, raise_form(console, "acme", "team", PRO_TEAM))
    [action] = recent_actions(console)
    assert action == (
        'Raised team: token_bucket(1000, 100/s) x2 for 4 h for <a href="/admin/dashboard/tenants/acme/">acme</a> '
        "(an expiring override, now token_bucket(2000, 200/s))"
    )


def test_a_deletion_names_what_was_deleted_without_a_link(api, console):
    acme = Tenant.objects.get(key="acme")
    response = console.post(f"/admin/policies/tenant/{acme.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert recent_actions(console) == ["Deleted tenant acme"]


def test_a_change_of_another_model_reads_as_djangos_message(api, console, operator):
    someone = get_user_model().objects.create_user("someone", password="pw-for-tests-2")
    data = {"username": "someone-else", "is_active": "on", "last_login_0": "", "last_login_1": "",
            "date_joined_0": "2026-06-01", "date_joined_1": "00:00:00"}  # fmt: skip
    assert console.post(f"/admin/auth/user/{someone.pk}/change/", data).status_code == 302
    [action] = recent_actions(console)
    link = f'<a href="/admin/auth/user/{someone.pk}/change/">someone-else</a>'
    assert action == f"Changed user {link}: changed Username and Date joined"


def test_an_operator_sees_only_their_own_actions(api, console, client):
    console.post(DASHBOARD + "reset/", {"level": "team", "key": "acme", "team": ""})
    other = get_user_model().objects.create_superuser("other", password="pw-for-tests-3")
    client.force_login(other)
    assert "None available" in text(client.get("/admin/").content.decode())


def test_the_index_shows_the_last_ten(api, console):
    for _ in range(12):
        console.post(DASHBOARD + "reset/", {"level": "team", "key": "acme", "team": ""})
    assert len(recent_actions(console)) == 10
