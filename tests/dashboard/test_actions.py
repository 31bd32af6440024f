"""The bucket panel's actions: reset a key's buckets (confirmed, audited, CSRF-protected)
and a dry-run decision that takes nothing."""

import html as html_lib
import json
import re

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.test import Client

from policies.models import Rule, Tenant
from tests.dashboard.conftest import DASHBOARD, decide, page, text

RESET = DASHBOARD + "reset/"
DRY_RUN = DASHBOARD + "dry-run/"


def tokens(engine, level, key, team=None):
    """What each rule of the key has left now."""
    limiter = engine.limiter_for(key if level == "team" else team)
    return [row["state"]["remaining"] for row in limiter.inspect(level, key)]


# --- reset --------------------------------------------------------------------------------


def test_reset_first_asks_for_confirmation_and_resets_nothing(api, decide_client, console):
    decide(decide_client, {"team": "acme"}, cost=400)
    html = page(console, RESET, level="team", key="acme", team="")
    assert "Reset every bucket of team: acme?" in text(html)
    assert 'name="csrfmiddlewaretoken"' in html and 'id="reset-form"' in html and 'method="post"' in html
    assert "token_bucket(1000, 100/s)" in html  # what would be reset, with its state now
    assert tokens(api, "team", "acme") == [600]
    assert not LogEntry.objects.exists()


def test_reset_refills_every_bucket_of_the_key_and_writes_an_audit_entry(api, decide_client, console, operator):
    decide(decide_client, {"team": "acme"}, cost=400)
    decide(decide_client, {"team": "bigco"}, cost=100)  # another key keeps its state
    response = console.post(RESET, {"level": "team", "key": "acme", "team": ""})
    assert response.status_code == 302
    assert response["Location"] == f"{DASHBOARD}?level=team&key=acme&team=#buckets"
    assert tokens(api, "team", "acme") == [1000]
    assert tokens(api, "team", "bigco") == [500]
    entry = LogEntry.objects.get()
    assert entry.user == operator and entry.action_flag == CHANGE
    assert entry.content_type == ContentType.objects.get_for_model(Tenant)
    assert entry.object_id == str(Tenant.objects.get(key="acme").pk)
    assert entry.object_repr == "acme"
    assert entry.get_change_message() == "reset the buckets of acme"
    html = console.get(response["Location"]).content.decode()
    assert "The buckets of acme were reset: they start full." in html


def test_reset_of_a_user_key_uses_its_teams_tier_and_is_logged_on_its_teams_tenant(api, decide_client, console):
    decide(decide_client, {"user": "u1", "team": "acme"}, cost=30)
    console.post(RESET, {"level": "user", "key": "u1", "team": "acme"})
    assert tokens(api, "user", "u1", "acme") == [600, 50]
    entry = LogEntry.objects.get()
    assert entry.content_type == ContentType.objects.get_for_model(Tenant)
    assert entry.object_id == str(Tenant.objects.get(key="acme").pk)
    assert (entry.object_repr, entry.change_message) == ("acme / u1", "reset the buckets of acme / u1")


def test_reset_of_a_key_whose_team_is_no_tenant_is_logged_with_no_object(api, decide_client, console):
    console.post(RESET, {"level": "user", "key": "u1", "team": "nobody"})
    entry = LogEntry.objects.get()
    assert entry.content_type is None and entry.object_id is None
    assert entry.change_message == "reset the buckets of nobody / u1"


def test_the_admin_index_lists_the_reset_among_my_actions_as_a_sentence_linking_the_tenant(api, console):
    console.post(RESET, {"level": "user", "key": "alice", "team": "acme"})
    html = console.get("/admin/").content.decode()
    assert 'Reset the buckets of <a href="/admin/dashboard/tenants/acme/">acme / alice</a>' in html
    assert "Unknown content" not in html


def test_reset_refuses_a_post_without_the_csrf_token(api, decide_client, operator):
    decide(decide_client, {"team": "acme"}, cost=400)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(operator)
    response = browser.post(RESET, {"level": "team", "key": "acme"})
    assert response.status_code == 403
    assert tokens(api, "team", "acme") == [600]
    assert not LogEntry.objects.exists()


def test_reset_goes_through_with_the_token_of_its_confirmation_page(api, decide_client, operator):
    decide(decide_client, {"team": "acme"}, cost=400)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(operator)
    html = browser.get(RESET, {"level": "team", "key": "acme"}).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)
    response = browser.post(RESET, {"level": "team", "key": "acme", "team": "", "csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert tokens(api, "team", "acme") == [1000]
    assert LogEntry.objects.count() == 1


def test_a_get_never_resets(api, decide_client, console):
    decide(decide_client, {"team": "acme"}, cost=400)
    for _ in range(3):
        console.get(RESET, {"level": "team", "key": "acme"})
    assert tokens(api, "team", "acme") == [600]


@pytest.mark.parametrize(
    "form, field",
    [
        ({"level": "planet", "key": "acme"}, "level"),
        ({"level": "team", "key": ""}, "key"),
        ({"level": "team"}, "key"),
    ],
)
def test_a_bad_reset_shows_a_form_error_and_resets_nothing(api, console, form, field):
    for response in (console.get(RESET, form), console.post(RESET, form)):
        assert response.status_code == 200
        html = response.content.decode()
        assert "Nothing to reset: the query is not valid." in html and f"<b>{field}</b>" in html
    assert not LogEntry.objects.exists()


# --- dry run ------------------------------------------------------------------------------


def decision(html):
    start = html.index('id="dry-run-decision"')
    return text(html[html.index(">", start) + 1 : html.index("</dl>", start)])


def test_a_dry_run_shows_the_decision_and_each_rules_wait_and_takes_nothing(api, decide_client, console):
    decide(decide_client, {"team": "acme"}, cost=995)
    before = tokens(api, "team", "acme")
    assert before == [pytest.approx(5, abs=1e-3)]
    html = page(console, DRY_RUN, level="team", key="acme", team="", cost="10", priority="")
    assert 'data-allowed="false"' in html
    assert decision(html) == (
        "Denied (dry run: nothing taken) for team: acme, cost 10. "
        "retry_after 0.05 s blocked_by team: token_bucket(1000, 100/s) "
        "reason RATE_LIMITED remaining 5"
    )
    row = html[html.index('<tr data-rule="token_bucket(1000, 100/s)">') :]
    assert text(row[: row.index("</tr>")]) == "team: token_bucket(1000, 100/s) 0.05 s 5"
    assert tokens(api, "team", "acme") == before
    html = page(console, DRY_RUN, level="team", key="acme", cost="5")
    assert 'data-allowed="true"' in html and "blocked_by nothing reason OK" in decision(html)
    assert tokens(api, "team", "acme") == before  # allowed, and still nothing taken


def test_a_dry_run_applies_the_priority_watermark(api, decide_client, console):
    decide(decide_client, {"global": "*"}, cost=85_000)  # 15,000 left; batch must leave 20,000
    html = page(console, DRY_RUN, level="global", key="*", cost="1000", priority="batch")
    assert 'data-allowed="false"' in html and "blocked_by global: token_bucket(100000, 10000/s)" in decision(html)
    html = page(console, DRY_RUN, level="global", key="*", cost="1000", priority="interactive")
    assert 'data-allowed="true"' in html


def test_a_dry_run_of_a_cost_that_never_fits_says_so(api, console):
    html = page(console, DRY_RUN, level="team", key="acme", cost="5000")
    assert "retry_after never: the cost exceeds a limit" in decision(html)
    assert "reason COST_EXCEEDS_LIMIT" in decision(html)


def test_the_page_renders_a_dry_run_without_javascript_too(api, console):
    html = page(console, level="team", key="acme", team="", cost="3", priority="interactive")
    assert 'data-allowed="true"' in html and 'id="bucket-rules"' in html
    assert f'hx-get="{DRY_RUN}" hx-target="#dry-run"' in html


@pytest.mark.parametrize(
    "query, field, message",
    [
        ({"cost": "-1"}, "cost", "must be more than 0"),
        ({"cost": "0"}, "cost", "must be more than 0"),
        ({"cost": "lots"}, "cost", "Enter a number."),
        ({"cost": "1e400"}, "cost", "Enter a number."),
        (
            {"cost": "1", "priority": "vip"},
            "priority",
            "Select a valid choice. vip is not one of the available choices.",
        ),
        ({"cost": "1", "level": "planet"}, "level", "Select a valid choice."),
        ({"cost": "1", "key": ""}, "key", "This field is required."),
    ],
)
def test_a_bad_dry_run_shows_a_form_error_never_a_500(api, console, query, field, message):
    query = {"level": "team", "key": "acme", "team": "", **query}
    for path in (DRY_RUN, DASHBOARD):
        html = page(console, path, **query)
        assert 'id="dry-run-errors"' in html or 'id="bucket-errors"' in html
        assert f"<b>{field}</b>: " in html and message in html
        assert 'id="dry-run-decision"' not in html


# --- a reset acts on exactly the buckets its page showed ----------------------------------


def test_a_user_keys_reset_acts_on_its_teams_buckets_and_no_other(api, decide_client, console):
    decide(decide_client, {"user": "u1", "team": "acme"}, cost=30)  # acme: pro
    decide(decide_client, {"user": "u1", "team": "initech"}, cost=5)  # initech: free
    html = page(console, RESET, level="user", key="u1", team="acme")
    shown = re.search(r'name="shown" value="([^"]*)"', html).group(1)
    console.post(RESET, {"level": "user", "key": "u1", "team": "acme", "shown": html_lib.unescape(shown)})
    assert tokens(api, "user", "u1", "acme") == [600, 50]
    assert tokens(api, "user", "u1", "initech") == [5]


def test_a_reset_whose_rules_changed_since_its_page_was_shown_resets_nothing(api, decide_client, console, clock):
    decide(decide_client, {"team": "acme"}, cost=400)
    html = page(console, RESET, level="team", key="acme", team="")
    shown = html_lib.unescape(re.search(r'name="shown" value="([^"]*)"', html).group(1))
    assert json.loads(shown) == ["team: token_bucket(1000, 100/s)"]
    tier_rule = Rule.objects.get(tier__name="pro", level__name="team")
    tier_rule.params = {"capacity": 1000, "per_second": 50}
    tier_rule.save()
    clock.advance(1)
    response = console.post(RESET, {"level": "team", "key": "acme", "team": "", "shown": shown})
    assert response.status_code == 200
    assert "Nothing was reset: the rules of this key changed since the page was shown" in text(
        response.content.decode()
    )
    assert not LogEntry.objects.exists()
