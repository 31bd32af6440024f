"""The admin's history pages: each tier's and tenant's record keeps the rules it had, and
"Revert" puts a row back as it was (a tier's or tenant's rules too, a priority class's
levels), in one transaction, or refuses with a message; never a 500, never half a revert. The
list of versions shows what each changed, a tier's or tenant's rules field by field."""

from __future__ import annotations

import datetime as dt
import html
import io
import json
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.forms import MultiWidget
from django.test import Client

from policies.models import Level, PriorityClass, Rule, Tenant, Tier, rule_specs
from tests.api.conftest import make_token, memory_engine, token_client  # noqa: F401  (fixtures)

from .test_admin import params_data, tier_form

pytestmark = pytest.mark.django_db

PRO_RULES = {
    "user": [
        {"type": "sliding_window", "limit": 600, "window": 60, "label": "RPM_LIMIT"},
        {"type": "token_bucket", "capacity": 50, "per_second": 10, "label": "BURST_LIMIT"},
    ],
    "team": [{"type": "token_bucket", "capacity": 1000, "per_second": 100}],
}
NEW_RULES = {"user": [{"type": "token_bucket", "capacity": 7, "per_second": 7}]}
TEAM_RULE = [{"type": "token_bucket", "capacity": 100, "per_second": 10}]


@pytest.fixture
def loaded(memory_engine, load, policy):  # noqa: F811
    load(policy)


@pytest.fixture
def admin(loaded):
    """An operator's browser, logged in to the admin."""
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("operator", password="pw-for-tests"))
    return client


@pytest.fixture
def api(loaded):
    return token_client(make_token("admin", "ops-script"))


def pro() -> Tier:
    return Tier.objects.get(name="pro")


def rules_of(owner) -> dict:
    return rule_specs(owner.rules.select_related("level"))


def history_url(row, record) -> str:
    return f"/admin/policies/{row._meta.model_name}/{row.pk}/history/{record.history_id}/"


def revert(admin: Client, row, record, follow: bool = False):
    """Open the version's history page and press Revert, sending the form as the page shows it."""
    url = history_url(row, record)
    page = admin.get(url)
    assert page.status_code == 200
    return admin.post(url, form_data(page.context["adminform"].form), follow=follow)


def form_data(form) -> dict:
    """What a browser sends for an unbound form as rendered: each field's value on the page."""
    data = {}
    for name, field in form.fields.items():
        value = form[name].value()
        if isinstance(field.widget, MultiWidget):
            for i, part in enumerate(field.widget.decompress(value)):
                data[f"{name}_{i}"] = "" if part is None else part
        elif isinstance(value, bool):
            if value:
                data[name] = "on"
        else:
            data[name] = "" if value is None else value
    return data


def text(response) -> str:
    return html.unescape(response.content.decode())


# --- each version keeps its rules -------------------------------------------------------------------


def test_a_tiers_records_keep_its_rules_whichever_path_changed_them(admin, api, load, policy):
    assert rules_from(pro().history.latest()) == PRO_RULES  # made by the load

    api.put("/api/v1/tiers/pro", {"name": "pro", "rules": NEW_RULES, "version": 1}, format="json")
    assert rules_from(pro().history.latest()) == NEW_RULES

    rule = pro().rules.get()
    client_post_rule(admin, rule, params={"capacity": 8, "per_second": 8})
    assert rules_from(pro().history.latest()) == {"user": [{"type": "token_bucket", "capacity": 8, "per_second": 8}]}

    tier = pro()
    rules = list(tier.rules.all())
    rules[0].params = {"capacity": 9, "per_second": 9}
    assert admin.post(f"/admin/policies/tier/{tier.pk}/change/", tier_form(tier, rules=rules)).status_code == 302
    assert rules_from(pro().history.latest()) == {"user": [{"type": "token_bucket", "capacity": 9, "per_second": 9}]}

    load(policy)
    assert rules_from(pro().history.latest()) == PRO_RULES
    # Every record holds what its write left, not what came later.
    assert [rules_from(record) for record in pro().history.order_by("history_date")][-1] == PRO_RULES
    assert rules_from(pro().history.order_by("history_date")[1]) == NEW_RULES


def rules_from(record) -> dict:
    levels = dict(Level.objects.values_list("pk", "name"))
    out: dict = {}
    for row in record.rules:
        fields = {name: row[name] for name in ("type", "params", "label", "shadow", "counts")}
        out.setdefault(levels[row["level"]], []).append(Rule(**fields).spec())
    return out


def client_post_rule(admin: Client, rule: Rule, **changes):
    """Save a rule on its own page."""
    data = {
        "tier": rule.tier_id or "",
        "tenant": rule.tenant_id or "",
        "level": rule.level_id,
        "type": rule.type,
        **params_data(rule.type, changes.get("params", rule.params)),
        "label": rule.label,
        "counts": rule.counts,
        "position": rule.position,
    }
    response = admin.post(f"/admin/policies/rule/{rule.pk}/change/", data)
    assert response.status_code == 302, text(response)


# --- the history pages: every version's changes, rules included ------------------------------------


def changes_column(page: str) -> list[str]:
    """The Changes cell of each version on a history list page, newest first, as text."""
    table = page[page.index('id="change-history"') :]
    rows = table[table.index("<tbody>") : table.index("</tbody>")].split("<tr>")[1:]
    cells = [row.rsplit("<td>", 1)[1] for row in rows]
    return [
        " | ".join(
            re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", item)).strip()
            for item in re.findall(r"<li[^>]*>(.*?)</li>", cell, re.S)
        )
        for cell in cells
    ]


def test_a_tiers_history_page_shows_its_rules_changes_field_by_field(admin):
    tier = pro()
    rules = list(tier.rules.all())
    rules[1].params = {"capacity": 60, "per_second": 10}  # user: token_bucket BURST_LIMIT
    assert admin.post(f"/admin/policies/tier/{tier.pk}/change/", tier_form(tier, rules=rules)).status_code == 302

    page = text(admin.get(f"/admin/policies/tier/{tier.pk}/history/"))
    changed, created = changes_column(page)
    assert changed == "user: token_bucket capacity 50 → 60"
    assert created.startswith("user: added sliding_window(600/60s) [RPM_LIMIT] | user: added token_bucket(50, 10/s)")
    assert "version" not in changed  # the lock's counter moves with every save: no change of the operator's


def test_a_tiers_history_shows_rules_added_and_removed_and_its_own_fields(admin, api):
    pk = pro().pk
    api.put("/api/v1/tiers/pro", {"name": "professional", "rules": NEW_RULES, "version": 1}, format="json")
    page = text(admin.get(f"/admin/policies/tier/{pk}/history/"))
    assert changes_column(page)[0] == (
        "name pro → professional | user: token_bucket capacity 50 → 7 | user: token_bucket per_second 10 → 7 | "
        "user: token_bucket label BURST_LIMIT → none | user: removed sliding_window(600/60s) [RPM_LIMIT] | "
        "team: removed token_bucket(1000, 100/s)"
    )


def test_a_tenants_history_page_shows_its_tier_and_its_overrides_changes(admin, api):
    bigco = Tenant.objects.get(key="bigco")
    api.patch(
        "/api/v1/tenants/bigco",
        {"tier": "free", "overrides": {"team": [{"type": "token_bucket", "capacity": 900, "per_second": 10}]},
         "version": 1},
        format="json",
    )  # fmt: skip
    page = text(admin.get(f"/admin/policies/tenant/{bigco.pk}/history/"))
    assert changes_column(page)[0] == "tier pro → free | team: token_bucket capacity 600 → 900"
    assert "token:ops-script" in page  # who: the service token, as the change reason


def test_a_rule_edited_on_its_own_page_shows_in_its_tiers_history(admin):
    rule = pro().rules.get(level__name="team")
    client_post_rule(admin, rule, params={"capacity": 1500, "per_second": 100})
    page = text(admin.get(f"/admin/policies/tier/{pro().pk}/history/"))
    assert changes_column(page)[0] == "team: token_bucket capacity 1000 → 1500"
    page = text(admin.get(f"/admin/policies/rule/{rule.pk}/history/"))
    assert changes_column(page)[0] == "capacity 1000 → 1500"


def test_the_last_version_on_a_history_page_is_diffed_against_the_one_before_it(admin, monkeypatch):
    from policies.admin import TierAdmin

    monkeypatch.setattr(TierAdmin, "history_list_per_page", 1)
    tier = pro()
    tier.name = "pro2"
    tier.save()
    page = text(admin.get(f"/admin/policies/tier/{tier.pk}/history/"))
    assert changes_column(page) == ["name pro → pro2"]


# --- reverting ----------------------------------------------------------------------------------


def test_reverting_a_tier_puts_its_name_and_its_rules_back(admin, api):
    first = pro().history.earliest()
    api.put("/api/v1/tiers/pro", {"name": "professional", "rules": NEW_RULES, "version": 1}, format="json")

    response = revert(admin, pro_by_pk(first), first)

    assert response.status_code == 302
    tier = Tier.objects.get(pk=first.id)
    assert (tier.name, tier.version) == ("pro", 3)
    assert rules_of(tier) == PRO_RULES
    assert [(r.level.name, r.position) for r in tier.rules.all()] == [("user", 0), ("user", 1), ("team", 0)]
    latest = tier.history.latest()
    assert (latest.history_type, latest.history_user.username, rules_from(latest)) == ("~", "operator", PRO_RULES)


def pro_by_pk(record) -> Tier:
    return Tier.objects.get(pk=record.id)


def test_reverting_a_tier_undoes_a_change_made_on_a_rules_own_page(admin):
    before = pro().history.latest()
    rule = pro().rules.get(level__name="team")
    client_post_rule(admin, rule, params={"capacity": 5, "per_second": 5})
    assert rules_of(pro())["team"] == [{"type": "token_bucket", "capacity": 5, "per_second": 5}]

    assert revert(admin, pro(), before).status_code == 302

    assert rules_of(pro()) == PRO_RULES


def test_the_history_page_of_a_tier_shows_the_rules_it_puts_back(admin, api):
    first = pro().history.earliest()
    api.put("/api/v1/tiers/pro", {"name": "pro", "rules": NEW_RULES, "version": 1}, format="json")
    page = text(admin.get(history_url(pro(), first)))
    assert "Rules at this version" in page and "Reverting puts these rules back" in page
    assert '{"type": "sliding_window", "limit": 600, "window": 60, "label": "RPM_LIMIT"}' in page
    assert 'value="Revert"' in page


def test_reverting_a_tenant_puts_its_overrides_back(admin, api):
    bigco = Tenant.objects.get(key="bigco")
    first = bigco.history.earliest()
    api.patch("/api/v1/tenants/bigco", {"tier": "free", "overrides": {"team": None}, "version": 1}, format="json")
    assert not Tenant.objects.get(key="bigco").rules.exists()

    assert revert(admin, bigco, first).status_code == 302

    bigco = Tenant.objects.get(key="bigco")
    assert bigco.tier.name == "pro"
    assert rules_of(bigco) == {"team": [{"type": "token_bucket", "capacity": 600, "per_second": 10}]}


def test_reverting_a_level_puts_its_fields_back(admin, api):
    team = Level.objects.get(name="team")
    first = team.history.earliest()
    api.patch("/api/v1/levels/team", {"fail_mode": "closed", "version": 1}, format="json")

    assert revert(admin, team, first).status_code == 302

    assert Level.objects.filter(pk=team.pk).values_list("fail_mode", "version").get() == ("open", 3)


def test_reverting_a_priority_class_puts_its_levels_back(admin, api):
    batch = PriorityClass.objects.get(name="batch")
    first = batch.history.latest()  # the load saved it, then set its levels: two records
    api.patch("/api/v1/priorities/batch", {"watermark": 0.5, "levels": ["team"], "version": 1}, format="json")

    assert revert(admin, batch, first).status_code == 302

    batch = PriorityClass.objects.get(name="batch")
    assert (batch.watermark, [level.name for level in batch.levels.all()]) == (0.2, ["global"])


def test_reverting_a_rule_on_its_own_page_puts_it_back_and_moves_its_tiers_version(admin, api):
    rule = pro().rules.get(level__name="team")
    first = rule.history.earliest()
    client_post_rule(admin, rule, params={"capacity": 5, "per_second": 5})
    version = pro().version

    assert revert(admin, rule, first).status_code == 302

    assert Rule.objects.get(pk=rule.pk).params == {"capacity": 1000, "per_second": 100}
    assert pro().version == version + 1


# --- refusals: a message, never a 500, nothing half-saved ---------------------------------------


def test_a_revert_after_someone_else_saved_is_refused_as_stale_and_changes_nothing(admin, api):
    first = pro().history.earliest()
    api.put("/api/v1/tiers/pro", {"name": "pro", "rules": NEW_RULES, "version": 1}, format="json")
    url = history_url(pro(), first)
    opened = form_data(admin.get(url).context["adminform"].form)
    api.patch("/api/v1/tiers/pro", {"name": "pro2", "version": 2}, format="json")  # someone else, meanwhile

    response = admin.post(url, opened)

    assert response.status_code == 200
    assert "changed since you opened it" in text(response)
    assert (pro_by_pk(first).name, rules_of(pro_by_pk(first))) == ("pro2", NEW_RULES)


def test_a_revert_that_loses_the_race_after_the_check_is_rolled_back_with_a_message(admin, api, monkeypatch):
    from policies.admin import VersionedForm

    first = pro().history.earliest()
    api.put("/api/v1/tiers/pro", {"name": "renamed", "rules": NEW_RULES, "version": 1}, format="json")
    real_clean = VersionedForm.clean

    def someone_saves_right_after_the_check(form):
        data = real_clean(form)
        Tier.objects.filter(pk=first.id).update(version=9)  # another save lands here
        return data

    monkeypatch.setattr(VersionedForm, "clean", someone_saves_right_after_the_check)
    response = revert(admin, pro_by_pk(first), first, follow=True)

    assert response.status_code == 200
    assert "changed since you opened it" in text(response)
    tier = pro_by_pk(first)
    assert (tier.name, rules_of(tier)) == ("renamed", NEW_RULES)


def test_a_deleted_tier_is_not_reverted_the_page_says_why_and_offers_no_revert(admin, api):
    api.post("/api/v1/tiers", {"name": "gold", "rules": NEW_RULES}, format="json")
    gold = Tier.objects.get(name="gold")
    record = gold.history.earliest()
    api.delete("/api/v1/tiers/gold")
    url = f"/admin/policies/tier/{record.id}/history/{record.history_id}/"

    page = admin.get(url)
    assert page.status_code == 200
    assert "This tier was deleted: reverting cannot bring it back." in text(page)
    assert 'value="Revert"' not in text(page)

    response = admin.post(url, {"name": "gold", "opened_version": ""}, follow=True)
    assert response.status_code == 200 and "This tier was deleted" in text(response)
    assert not Tier.objects.filter(name="gold").exists()


def test_a_version_recorded_without_its_rules_is_not_reverted(admin, api):
    first = pro().history.earliest()
    type(first).objects.filter(pk=first.pk).update(rules=None)  # as records made before rules were kept
    api.put("/api/v1/tiers/pro", {"name": "renamed", "rules": NEW_RULES, "version": 1}, format="json")

    response = revert(admin, pro_by_pk(first), first, follow=True)

    assert "was recorded without its rules" in text(response)
    assert (pro_by_pk(first).name, rules_of(pro_by_pk(first))) == ("renamed", NEW_RULES)


def test_a_version_whose_rules_now_repeat_a_global_rule_is_not_reverted(admin, api):
    first = pro().history.earliest()
    api.put("/api/v1/tiers/pro", {"name": "renamed", "rules": NEW_RULES, "version": 1}, format="json")
    # A global rule added since, at the team level, the same as the pro tier's rule there was.
    Rule.objects.create(
        level=Level.objects.get(name="team"), type="token_bucket", params={"capacity": 1000, "per_second": 100}
    )

    response = revert(admin, pro_by_pk(first), first, follow=True)

    assert "Its rules at this version would break the policy as it is now: team[0]: repeats global rule 0" in text(
        response
    )
    assert (pro_by_pk(first).name, rules_of(pro_by_pk(first))) == ("renamed", NEW_RULES)


def test_a_version_whose_rules_are_at_a_level_deleted_since_is_not_reverted(admin, api):
    api.post("/api/v1/levels", {"name": "org"}, format="json")
    api.post("/api/v1/tiers", {"name": "gold", "rules": {"org": NEW_RULES["user"]}}, format="json")
    gold = Tier.objects.get(name="gold")
    first = gold.history.earliest()
    api.put("/api/v1/tiers/gold", {"name": "gold", "rules": NEW_RULES, "version": 1}, format="json")
    org = Level.objects.get(name="org")
    assert api.delete("/api/v1/levels/org").status_code == 204

    response = revert(admin, gold, first, follow=True)

    assert f"a rule at level #{org.pk}, which no longer exists" in text(response)
    assert rules_of(Tier.objects.get(name="gold")) == NEW_RULES


def test_only_an_operator_who_may_change_a_tier_can_revert_it(loaded, api):
    from django.contrib.auth.models import Permission

    first = pro().history.earliest()
    api.put("/api/v1/tiers/pro", {"name": "renamed", "rules": NEW_RULES, "version": 1}, format="json")
    viewer = get_user_model().objects.create_user("viewer", password="pw-for-tests", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_tier"))
    client = Client()
    client.force_login(viewer)

    response = client.post(history_url(pro_by_pk(first), first), {"name": "pro", "opened_version": 2})

    assert response.status_code == 403
    assert pro_by_pk(first).name == "renamed"


# --- the history reads well (issue 25) --------------------------------------------------------------


def history_rows(response) -> list[list[str]]:
    """The history list's rows, each cell's text."""
    table = text(response).split('id="change-history"', 1)[1].split("</table>", 1)[0]
    return [
        [" ".join(re.sub(r"<[^>]+>", " ", cell).split()) for cell in re.findall(r"<td>(.*?)</td>", row, re.DOTALL)]
        for row in re.findall(r"<tr>(.*?)</tr>", table, re.DOTALL)
        if "<td>" in row
    ]


def test_a_revert_says_revert_names_the_version_it_put_back_and_stays_on_the_row(admin, api):
    first = pro().history.earliest()
    api.put("/api/v1/tiers/pro", {"name": "pro", "rules": NEW_RULES, "version": 1}, format="json")

    response = revert(admin, pro(), first, follow=True)

    when = f"{first.history_date.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC (policy version {first.policy_version})"
    assert response.redirect_chain == [(f"/admin/policies/tier/{pro().pk}/change/", 302)]
    assert [str(m) for m in response.context["messages"]] == [f"Reverted the tier “pro” to its version of {when}."]
    assert pro().history.latest().history_change_reason == f"Revert to its version of {when}"
    newest = history_rows(admin.get(f"/admin/policies/tier/{pro().pk}/history/"))[0]
    assert newest[2:5] == ["Reverted", "operator", f"Revert to its version of {when}"]
    index = text(admin.get("/admin/"))
    assert f"Reverted tier pro to its version of {when}: user: token_bucket capacity 7 → 50" in re.sub(
        r"<[^>]+>", "", index
    )


def test_each_version_names_who_made_it_a_command_a_token_or_an_operator(loaded, commits, tmp_path):
    """Rows a policy file made said "None" twice where Policy versions knew the command."""
    path = tmp_path / "shop.yaml"
    path.write_text(json.dumps({"default_tier": "basic", "levels": ["team"], "tiers": {"basic": {"team": TEAM_RULE}}}))
    with commits():
        call_command("loadpolicies", str(path), stdout=io.StringIO())
    api = token_client(make_token("admin", "ops-script"))
    api.patch(
        "/api/v1/tiers/basic", {"version": 1, "rules": {"team": [{**TEAM_RULE[0], "capacity": 9}]}}, format="json"
    )
    operator = Client()
    operator.force_login(get_user_model().objects.create_superuser("operator", password="pw-for-tests"))
    basic = Tier.objects.get(name="basic")
    rows = history_rows(operator.get(f"/admin/policies/tier/{basic.pk}/history/"))
    assert [row[2:5] for row in rows] == [
        ["Changed", "token:ops-script", ""],  # the token said once, not again as the reason
        ["Created", "loadpolicies shop.yaml", ""],
    ]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", row[1]) for row in rows), rows


def test_a_version_without_overrides_says_so_rather_than_none(admin, api):
    acme = Tenant.objects.get(key="acme")
    first = acme.history.earliest()
    overrides = {"team": [{"type": "token_bucket", "capacity": 5, "per_second": 5}]}
    api.patch("/api/v1/tenants/acme", {"version": acme.version, "overrides": overrides}, format="json")
    page = text(admin.get(history_url(acme, first)))
    assert "No overrides: the tenant had no rules of its own, so its tier's rules applied." in page
    assert "Reverting removes its current rules." in page
    assert "<p>None.</p>" not in page


def test_times_on_the_history_and_the_policy_versions_are_in_utc_and_say_so(admin, api):
    api.put("/api/v1/tiers/pro", {"name": "pro", "rules": NEW_RULES, "version": 1}, format="json")
    for url in (f"/admin/policies/tier/{pro().pk}/history/", "/admin/policies/policychange/"):
        page = text(admin.get(url))
        assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", page), url
        assert "a.m." not in page and "p.m." not in page and "midnight" not in page, url
