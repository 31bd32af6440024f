"""loadpolicies and exportpolicies: a bad file changes nothing and names the field; an
export loads back to the same store."""

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError

from core import ConfigError
from policies.models import Alert, Level, PolicySettings, PriorityClass, Rule, Tenant, Tier
from policies.policyfile import check_document, export_policy, load_policy

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "policies" / "fixtures" / "demo.yaml"


def snapshot():
    """Everything in the store, as comparable data."""
    return {
        "levels": list(Level.objects.values_list("name", "position", "fail_mode", "fallback_fraction", "version")),
        "tiers": list(Tier.objects.values_list("name", "version")),
        "tenants": list(Tenant.objects.values_list("key", "tier__name", "overrides_until", "version")),
        "rules": sorted(
            Rule.objects.values_list(
                "tier__name", "tenant__key", "level__name", "type", "params", "label", "shadow", "counts", "position"
            ),
            key=repr,
        ),
        "priorities": [
            (p.name, p.watermark, sorted(lv.name for lv in p.levels.all()), p.version)
            for p in PriorityClass.objects.all()
        ],
        "default_tier": PolicySettings.objects.filter(pk=1).values_list("default_tier__name", flat=True).first(),
    }


def write(tmp_path, doc, name="policy.yaml"):
    path = tmp_path / name
    path.write_text(json.dumps(doc) if name.endswith(".json") else yaml.safe_dump(doc))
    return path


def load_file(path, commits):
    with commits():
        call_command("loadpolicies", str(path), stdout=io.StringIO())


def test_it_loads_the_spec_example(load, policy):
    load(policy)
    assert list(Level.objects.values_list("name", flat=True)) == ["user", "team", "global"]
    assert Tenant.objects.get(key="bigco").rules.get().params == {"capacity": 600, "per_second": 10}
    assert PolicySettings.load().default_tier.name == "free"
    assert Rule.objects.filter(tier=None, tenant=None).get().level.name == "global"


def test_a_bad_file_exits_non_zero_naming_the_file_the_field_and_the_reason(tmp_path, load, policy, commits):
    load(policy)
    before = snapshot()
    policy["tiers"]["pro"]["user"][0] = {"type": "token_bucket", "capacity": -5, "per_second": 1}
    policy["tenants"]["newco"] = {"tier": "free"}
    path = write(tmp_path, policy)

    with pytest.raises(CommandError) as caught:
        load_file(path, commits)

    assert str(caught.value).startswith(f"{path}: tiers.pro.user[0].capacity: must be greater than 0")
    assert snapshot() == before


def test_a_failure_while_writing_rolls_everything_back(tmp_path, load, policy, commits):
    load(policy)
    before = snapshot()
    policy["tenants"]["x" * 150 + "!" * 40] = {"tier": "free"}  # passes the file checks
    policy["levels"][0]["fail_mode"] = "closed"  # written first, then rolled back
    policy["tenants"]["acme"]["tier"] = "free"
    # A tier name the model refuses only at save time (too long for the column).
    policy["tiers"]["t" * 80] = policy["tiers"]["free"]

    with pytest.raises(CommandError, match=r"tiers\.t+\.name"):
        load_file(write(tmp_path, policy), commits)
    assert snapshot() == before


def test_the_command_runs_as_a_process_and_exits_non_zero(tmp_path):
    bad = write(tmp_path, {"tiers": {"pro": {"user": [{"type": "leaky"}]}}})
    result = subprocess.run(
        [sys.executable, "manage.py", "loadpolicies", str(bad)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"},
    )
    assert result.returncode == 1
    assert f"{bad}: tiers.pro.user[0].type: unknown rule type 'leaky'" in result.stderr


@pytest.mark.parametrize(
    "change, path, reason",
    [
        (lambda p: p["tiers"]["pro"]["user"][1].pop("capacity"), "tiers.pro.user[1].capacity", "is required"),
        (lambda p: p["tiers"]["pro"].update(minute=[]), "tiers.pro.minute", "unknown level"),
        (lambda p: p["tiers"].update(empty={}), "tiers.empty", "at least one rule"),
        (lambda p: p.update(default_tier="gold"), "default_tier", "unknown tier 'gold'"),
        (lambda p: p["tenants"]["acme"].update(tier="gold"), "tenants.acme.tier", "unknown tier"),
        (lambda p: p["tenants"]["bigco"].update(overrides_until="soon"), "tenants.bigco.overrides_until", "date"),
        (
            lambda p: p["tenants"]["bigco"].update(overrides_until="0001-01-01T00:00:00+05:00"),
            "tenants.bigco.overrides_until",
            "out of range",
        ),
        (lambda p: p["priorities"]["batch"].update(levels=["region"]), "priorities.batch.levels[0]", "unknown level"),
        (lambda p: p["priorities"]["batch"].update(watermark=1.5), "priorities.batch.watermark", "up to"),
        (lambda p: p["levels"][2].update(fail_mode="maybe"), "levels[2].fail_mode", "must be one of"),
        (lambda p: p["levels"].append({"name": "user"}), "levels[3].name", "appears twice"),
        (
            lambda p: (
                p["tiers"]["free"]["global"].append(p["global"][0])
                if "global" in p["tiers"]["free"]
                else p["tiers"]["free"].update({"global": list(p["global"])})
            ),
            "tiers.free.global[0]",
            "repeats global rule 0",
        ),
        (lambda p: p.update(tennants={}), "tennants", "unknown field"),
    ],
)
def test_a_bad_document_names_the_field(policy, change, path, reason):
    change(policy)
    with pytest.raises(ConfigError) as caught:
        check_document(policy)
    assert caught.value.path == path
    assert reason in caught.value.reason


def test_export_then_load_gives_the_same_store(tmp_path, load, policy, commits):
    policy["tiers"]["pro"]["user"][0].update(shadow=True, counts="requests")
    policy["global"] = {"global": policy["global"], "team": [{"type": "concurrency", "limit": 500}]}
    load(policy)
    before = snapshot()
    exported = tmp_path / "export.yaml"
    call_command("exportpolicies", str(exported), stdout=io.StringIO())

    load_file(exported, commits)

    assert snapshot() == before  # nothing changed, not even a version
    for model in (Rule, Tenant, PolicySettings, Tier, PriorityClass, Level):
        model.objects.all().delete()
    load_file(exported, commits)
    after = snapshot()
    assert {k: v for k, v in after.items() if k not in ("tiers", "tenants")} == {
        k: v for k, v in before.items() if k not in ("tiers", "tenants")
    }
    assert export_policy() == yaml.safe_load(exported.read_text())


def test_export_of_the_spec_example_is_the_example(load, policy):
    load(policy)
    exported = export_policy()
    assert exported["tiers"]["pro"] == policy["tiers"]["pro"]
    assert exported["global"] == policy["global"]
    assert exported["tenants"]["bigco"] == policy["tenants"]["bigco"]
    assert exported["priorities"] == policy["priorities"]
    assert exported["levels"][2] == policy["levels"][2]


def test_json_files_load_and_export(tmp_path, policy, commits):
    load_file(write(tmp_path, policy, "policy.json"), commits)
    out = io.StringIO()
    call_command("exportpolicies", stdout=out)
    assert yaml.safe_load(out.getvalue())["tenants"]["acme"] == {"tier": "pro"}
    target = tmp_path / "out.json"
    call_command("exportpolicies", str(target), stdout=io.StringIO())
    assert json.loads(target.read_text())["default_tier"] == "free"


def test_loading_replaces_what_the_file_leaves_out(load, policy):
    load(policy)
    del policy["tenants"]["bigco"]
    del policy["priorities"]["batch"]
    policy["tiers"]["free"]["user"] = [{"type": "gcra", "rate": 1, "burst": 5}]
    load(policy)
    assert not Tenant.objects.filter(key="bigco").exists()
    assert not Rule.objects.filter(tenant__isnull=False).exists()
    assert list(PriorityClass.objects.values_list("name", flat=True)) == ["interactive"]
    assert Rule.objects.get(tier__name="free", level__name="user").type == "gcra"


def test_a_load_bumps_the_version_of_tiers_whose_rules_changed_only(load, policy):
    load(policy)
    policy["tiers"]["free"]["team"][0]["capacity"] = 150
    load(policy)
    assert dict(Tier.objects.values_list("name", "version")) == {"free": 2, "pro": 1}


def test_a_load_bumps_the_version_of_levels_and_priority_classes_that_changed_only(load, policy):
    load(policy)
    policy["levels"][1]["fail_mode"] = "closed"
    policy["priorities"]["batch"]["levels"] = ["team"]  # its levels alone: a new version too
    load(policy)
    assert dict(Level.objects.values_list("name", "version")) == {"user": 1, "team": 2, "global": 1}
    assert dict(PriorityClass.objects.values_list("name", "version")) == {"batch": 2, "interactive": 1}
    assert "version" not in export_policy()["levels"][1]  # the file's format is unchanged


def test_a_tenant_without_a_tier_gets_the_default_tier(load, policy):
    policy["tenants"]["newco"] = {}
    load(policy)
    assert Tenant.objects.get(key="newco").tier.name == "free"


def test_the_demo_file_loads_and_the_short_name_finds_it(commits):
    with commits():
        call_command("loadpolicies", "demo", stdout=io.StringIO())
    assert set(Tier.objects.values_list("name", flat=True)) == {"free", "pro", "enterprise"}
    assert Tenant.objects.filter(overrides_until__isnull=False, rules__isnull=False).exists()
    assert PriorityClass.objects.count() == 2
    assert check_document(yaml.safe_load(DEMO.read_text()))


def test_if_empty_leaves_a_store_with_tiers_alone(load, policy):
    load(policy)
    before = snapshot()
    out = io.StringIO()
    call_command("loadpolicies", "--if-empty", "demo", stdout=out)
    assert "not empty" in out.getvalue()
    assert snapshot() == before


def test_a_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(CommandError, match="cannot read the file"):
        call_command("loadpolicies", str(tmp_path / "nope.yaml"))


def test_a_yaml_syntax_error_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("tiers: [unclosed")
    with pytest.raises(CommandError, match="not valid YAML"):
        call_command("loadpolicies", str(path))


@pytest.mark.parametrize(
    ("name", "text"),
    [
        pytest.param("policy.json", '{"tiers": {"pro": {"user": %s}}}' % ("[" * 62 + "]" * 62), id="JSON, 65 deep"),
        pytest.param("policy.yaml", "tiers: {pro: {user: %s}}" % ("[" * 62 + "]" * 62), id="YAML, 65 deep"),
        pytest.param("policy.json", "[" * 100_000 + "]" * 100_000, id="JSON, past Python's stack"),
        pytest.param("policy.yaml", "[" * 100_000 + "]" * 100_000, id="YAML, past Python's stack"),
        pytest.param("policy.yaml", "tiers: &loop [*loop]", id="YAML, an alias inside itself"),
    ],
)
def test_a_file_nested_more_than_64_levels_deep_is_refused_and_changes_nothing(
    tmp_path, load, policy, commits, name, text
):
    load(policy)
    before = snapshot()
    path = tmp_path / name
    path.write_text(text)
    kind = "JSON" if name.endswith(".json") else "YAML"
    with pytest.raises(CommandError, match=f"^{path}: the {kind} is nested more than 64 levels deep$"):
        load_file(path, commits)
    assert snapshot() == before


def test_a_file_nested_64_levels_deep_is_read_and_refused_for_its_field(tmp_path, commits):
    path = tmp_path / "policy.json"
    path.write_text('{"tiers": {"pro": {"user": %s}}}' % ("[" * 61 + "]" * 61))
    with pytest.raises(CommandError, match=r"tiers\.pro\.user\[0\]: a rule must be a mapping"):
        load_file(path, commits)


def test_load_policy_refuses_what_check_refuses(policy):
    policy["tiers"]["pro"]["team"] = "lots"
    with pytest.raises(ConfigError, match="tiers.pro.team"):
        load_policy(policy)
    assert not Tier.objects.exists()


def test_an_expiry_with_any_offset_python_reads_is_kept_as_the_same_moment_in_utc(policy):
    """PostgreSQL refuses offsets past 15:59 that Python parses: the loader keeps UTC."""
    import datetime as dt

    policy["tenants"]["bigco"]["overrides_until"] = "2042-01-13T09:14:50-21:00"
    load_policy(policy)
    kept = Tenant.objects.get(key="bigco").overrides_until
    assert kept == dt.datetime(2042, 1, 14, 6, 14, 50, tzinfo=dt.UTC)


@pytest.mark.parametrize(("given", "seconds"), [("90d", 90 * 86400), ("12h", 12 * 3600), ("3650d", 3650 * 86400)])
def test_an_expiry_given_as_a_duration_counts_from_the_load(policy, given, seconds):
    import datetime as dt

    from .conftest import START

    policy["tenants"]["bigco"]["overrides_until"] = given
    checked = check_document(policy, now=lambda: START)
    assert checked["tenants"]["bigco"]["overrides_until"] == START + dt.timedelta(seconds=seconds)


@pytest.mark.parametrize("given", ["90", "90 d", "1.5d", "0d", "3651d", "90w", "-1d", "P90D"])
def test_an_expiry_that_is_neither_a_moment_nor_a_duration_is_refused_at_its_path(policy, given):
    policy["tenants"]["bigco"]["overrides_until"] = given
    with pytest.raises(ConfigError) as refused:
        check_document(policy)
    assert refused.value.path == "tenants.bigco.overrides_until"
    assert "or a time from the load like 90d" in refused.value.reason


def test_the_demos_override_lasts_90_days_from_its_load_and_exports_as_that_moment(commits):
    """Issue 25: the demo's bigco override ended on a fixed 2026-12-31, already past (or about
    to be) for whoever ran `make run` later."""
    import datetime as dt

    from django.utils import timezone

    assert "2026-12-31" not in DEMO.read_text().split("overrides_until:", 1)[1].splitlines()[0]
    before = timezone.now().replace(microsecond=0)
    with commits():
        call_command("loadpolicies", "demo", stdout=io.StringIO())
    after = timezone.now()
    until = Tenant.objects.get(key="bigco").overrides_until
    assert before + dt.timedelta(days=90) <= until <= after + dt.timedelta(days=90)
    assert export_policy()["tenants"]["bigco"]["overrides_until"] == until.isoformat().replace("+00:00", "Z")


# --- alerts ---------------------------------------------------------------------------------------

ALERTS = {
    "denials": {"kind": "denied_share", "threshold": 0.2, "window": "5m", "url": "https://hooks.example.com/d"},
    "quota-90": {"kind": "quota_used", "threshold": 0.9, "url": "http://alertmanager:9093/q", "format": "slack"},
}


def with_alerts(policy, **secrets):
    policy["alerts"] = {name: {**spec, **secrets} for name, spec in ALERTS.items()}
    return policy


def test_alerts_load_with_their_secrets_and_export_without_them(tmp_path, policy, commits, monkeypatch):
    monkeypatch.setenv("DENIALS_HOOK_SECRET", "from-the-environment")
    policy = with_alerts(policy, secret="in-the-file")
    policy["alerts"]["denials"] = {**ALERTS["denials"], "secret_env": "DENIALS_HOOK_SECRET", "enabled": False}
    load_file(write(tmp_path, policy), commits)
    assert dict(Alert.objects.values_list("name", "secret")) == {
        "denials": "from-the-environment",
        "quota-90": "in-the-file",
    }
    assert Alert.objects.get(name="denials").enabled is False
    exported = export_policy()["alerts"]
    assert exported == {"denials": {**ALERTS["denials"], "enabled": False}, "quota-90": ALERTS["quota-90"]}


def test_an_exported_file_loads_back_byte_for_byte_keeping_the_secrets(tmp_path, policy, commits):
    load_file(write(tmp_path, with_alerts(policy, secret="kept")), commits)
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    call_command("exportpolicies", str(first), stdout=io.StringIO())
    assert "kept" not in first.read_text() and "secret" not in first.read_text()
    versions = dict(Alert.objects.values_list("name", "version"))
    load_file(first, commits)
    call_command("exportpolicies", str(second), stdout=io.StringIO())
    assert second.read_bytes() == first.read_bytes()
    assert dict(Alert.objects.values_list("name", "version")) == versions  # nothing changed
    assert set(Alert.objects.values_list("secret", flat=True)) == {"kept"}


def test_a_new_alert_without_a_secret_is_refused_and_nothing_is_loaded(tmp_path, policy, commits):
    policy = with_alerts(policy)
    policy["tiers"]["free"]["user"][0]["capacity"] = 11
    with pytest.raises(CommandError) as refused:
        load_file(write(tmp_path, policy), commits)
    assert "alerts.denials.secret: a new alert needs a secret" in str(refused.value)
    assert not Tier.objects.exists() and not Alert.objects.exists()


def test_loading_a_file_replaces_the_alerts(load, policy):
    load(with_alerts(policy, secret="s"))
    del policy["alerts"]["denials"]
    policy["alerts"]["quota-90"] = {"kind": "quota_used", "threshold": 0.95, "url": "https://x.io/"}  # keeps its secret
    load(policy)
    alert = Alert.objects.get()
    assert (alert.name, alert.threshold, alert.format, alert.secret, alert.version) == (
        "quota-90",
        0.95,
        "json",
        "s",
        2,
    )
    del policy["alerts"]
    load(policy)
    assert not Alert.objects.exists()


@pytest.mark.parametrize(
    "change, path, reason",
    [
        ({"url": "ftp://x/"}, "alerts.denials.url", "must be an http:// or https:// URL, not ftp:"),
        ({"url": None}, "alerts.denials.url", "a webhook URL is required"),
        ({"threshold": 0}, "alerts.denials.threshold", "above 0 and at most 1"),
        ({"threshold": True}, "alerts.denials.threshold", "must be a number"),
        ({"window": None}, "alerts.denials.window", "a denied_share alert needs a window"),
        ({"kind": "quota_used"}, "alerts.denials.window", "only a denied_share alert has a window"),
        ({"format": "html"}, "alerts.denials.format", "must be one of json, slack"),
        ({"enabled": "no"}, "alerts.denials.enabled", "must be true or false"),
        ({"secret": ""}, "alerts.denials.secret", "a secret is required"),
        ({"secret_env": "LIMITER_TEST_NOT_SET"}, "alerts.denials.secret_env", "names no environment variable"),
        ({"hook": "x"}, "alerts.denials.hook", "unknown field"),
    ],
)
def test_a_bad_alert_in_a_file_names_its_path(policy, change, path, reason):
    policy = with_alerts(policy, secret="s")
    policy["alerts"]["denials"] = {k: v for k, v in {**policy["alerts"]["denials"], **change}.items() if v is not None}
    if "secret_env" in change:
        del policy["alerts"]["denials"]["secret"]
    with pytest.raises(ConfigError) as caught:
        check_document(policy)
    assert (caught.value.path, reason in caught.value.reason) == (path, True), caught.value


def test_a_bad_alert_name_or_section_names_its_path(policy):
    for alerts, path in (([], "alerts"), ({"two words": {}}, "alerts.two words"), ({"a": []}, "alerts.a")):
        policy["alerts"] = alerts
        with pytest.raises(ConfigError) as caught:
            check_document(policy)
        assert caught.value.path == path


# --- quota rules ----------------------------------------------------------------------------------

QUOTAS = {
    "monthly": {"type": "quota", "limit": 10_000_000, "period": "month", "timezone": "Europe/Berlin", "label": "MONTH"},
    "daily_soft": {"type": "quota", "limit": 100_000, "period": "day", "mode": "soft", "demote_to": "batch"},
    "credits": {"type": "quota", "limit": 2_000_000, "period": "none"},
    "weekly": {"type": "quota", "limit": 500, "period": "week", "timezone": "America/Sao_Paulo", "shadow": True},
}


def test_quota_rules_load_and_export_back_byte_for_byte(tmp_path, policy, commits):
    policy["tiers"]["pro"]["team"] = [*policy["tiers"]["pro"]["team"], QUOTAS["monthly"], QUOTAS["daily_soft"]]
    policy["tiers"]["free"]["user"] = [*policy["tiers"]["free"]["user"], QUOTAS["weekly"]]
    policy["tenants"]["bigco"]["overrides"]["team"] = [QUOTAS["credits"]]
    load_file(write(tmp_path, policy), commits)
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    call_command("exportpolicies", str(first), stdout=io.StringIO())
    exported = yaml.safe_load(first.read_text())
    assert exported["tiers"]["pro"]["team"][1:] == [QUOTAS["monthly"], QUOTAS["daily_soft"]]
    assert exported["tiers"]["free"]["user"][1:] == [QUOTAS["weekly"]]
    assert exported["tenants"]["bigco"]["overrides"]["team"] == [QUOTAS["credits"]]
    rules = sorted(Rule.objects.filter(type="quota").values_list("params", flat=True), key=json.dumps)
    assert len(rules) == 4
    load_file(first, commits)
    call_command("exportpolicies", str(second), stdout=io.StringIO())
    assert second.read_bytes() == first.read_bytes()
    assert sorted(Rule.objects.filter(type="quota").values_list("params", flat=True), key=json.dumps) == rules


@pytest.mark.parametrize(
    "spec, path, reason",
    [
        ({"timezone": "Mars/Olympus"}, "tiers.pro.team[1].timezone", "unknown time zone 'Mars/Olympus'"),
        ({"limit": -5}, "tiers.pro.team[1].limit", ""),
        ({"period": "fortnight"}, "tiers.pro.team[1].period", ""),
        ({"mode": "soft", "demote_to": "background"}, "tiers.pro.team[1].demote_to", "background"),
    ],
)
def test_a_bad_quota_is_refused_naming_its_field_and_nothing_is_loaded(tmp_path, policy, commits, spec, path, reason):
    policy["tiers"]["pro"]["team"] = [*policy["tiers"]["pro"]["team"], {**QUOTAS["monthly"], **spec}]
    with pytest.raises(CommandError) as refused:
        load_file(write(tmp_path, policy), commits)
    assert path in str(refused.value) and reason in str(refused.value), str(refused.value)
    assert not Tier.objects.exists() and not Rule.objects.exists()
