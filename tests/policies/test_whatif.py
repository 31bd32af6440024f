"""What-if: recorded traffic replayed under the current policy and under a draft laid over it.

The recorded pattern is bursts of requests at one instant each, so that the counts follow from
the bucket's capacity alone: a token bucket that starts full allows exactly `capacity`
requests of cost 1 at one instant, and a minute later (at 1 token a second) it is full again.
"""

import copy
import datetime as dt
import io
import re
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from core import ConfigError, ManualClock
from core.recorder import DecisionRecorder
from policies.compile import read_policy
from policies.policyfile import export_policy, load_policy
from policies.services.whatif import draft_policies, merge_draft, series_step, what_if, what_if_table
from policies.telemetry import install_decision_recorder, reset_decision_recorder
from tests.serving import ROOT

from .conftest import START
from .test_policyfile import snapshot

pytestmark = pytest.mark.django_db

TEAM = [{"type": "token_bucket", "capacity": 10, "per_second": 1}]
POLICY = {
    "default_tier": "std",
    "levels": ["user", "team", "global"],
    "tiers": {
        "std": {"user": [{"type": "token_bucket", "capacity": 1000, "per_second": 100}], "team": TEAM},
        "big": {"team": [{"type": "token_bucket", "capacity": 50, "per_second": 5}]},
    },
    "global": [{"type": "token_bucket", "capacity": 100000, "per_second": 10000}],
    "tenants": {"acme": {"tier": "std"}, "beta": {"tier": "std"}},
    "priorities": {"batch": {"watermark": 0.5, "levels": ["team"]}},
}
BURST = 30  # acme's requests in each burst
BETA_BURST = 3  # beta's
BURSTS_AT = (60.0, 180.0)  # seconds after the window's start: two minutes apart, the bucket full again
WINDOW = 300.0


def bucket(capacity: int, per_second: int = 1) -> list[dict]:
    return [{"type": "token_bucket", "capacity": capacity, "per_second": per_second}]


def name(capacity: int, per_second: int = 1) -> str:
    return f"team: token_bucket({capacity}, {per_second}/s)"


@pytest.fixture
def clock():
    return ManualClock(START.timestamp())


@pytest.fixture
def recorder(clock):
    recorder = DecisionRecorder(clock=clock, flush_every=None)
    install_decision_recorder(recorder)
    yield recorder
    reset_decision_recorder()


@pytest.fixture
def policy(load):
    load(copy.deepcopy(POLICY))


@pytest.fixture
def recorded(policy, recorder, clock):
    """The bursts, decided by the current policy and recorded as the service records them."""
    start = clock.now
    for offset in BURSTS_AT:
        clock.now = start + offset
        for team, count in (("acme", BURST), ("beta", BETA_BURST)):
            for i in range(count):
                # The outcome recorded is not what the replay uses: any will do here.
                recorder.decision({"user": f"{team}-u{i}", "team": team, "global": "*"}, 1, None, _allowed())
    clock.now = start + WINDOW - 1
    return clock.now + 1 - WINDOW  # a window of WINDOW seconds ending now starts a second before the first record


def _allowed():
    from core import Decision

    return Decision(True)


def tenant(report, key):
    return next(row for row in report["tenants"] if row["tenant"] == key)


# --- the recorded pattern under a tighter and a looser draft ---------------------------------------


def test_a_tighter_draft_denies_what_the_smaller_bucket_cannot_hold(recorded):
    report = what_if({"tiers": {"std": {"team": bucket(4)}}}, WINDOW)
    acme = tenant(report, "acme")
    # Now: 10 of each burst of 30; under the draft: 4 of each.
    assert acme == {
        "tenant": "acme",
        "tier_now": "std",
        "tier_draft": "std",
        "decisions": 2 * BURST,
        "allowed_now": 2 * 10,
        "allowed_draft": 2 * 4,
        "newly_denied": 2 * (10 - 4),
        "newly_allowed": 0,
        "blocked_by_draft": {name(4): 2 * (BURST - 4)},
    }
    # beta's 3 fit either bucket.
    assert tenant(report, "beta")["allowed_draft"] == tenant(report, "beta")["allowed_now"] == 2 * BETA_BURST
    assert [row["tenant"] for row in report["tenants"]] == ["acme", "beta"]  # most newly denied first
    assert report["totals"]["decisions"] == 2 * (BURST + BETA_BURST)
    assert report["totals"]["newly_denied"] == 12
    assert report["totals"]["blocked_by_now"] == {name(10): 2 * (BURST - 10)}
    assert report["replayed"] == 2 * (BURST + BETA_BURST)


def test_a_looser_draft_allows_what_the_current_policy_denies(recorded):
    report = what_if({"tiers": {"std": {"team": bucket(50)}}}, WINDOW)
    acme = tenant(report, "acme")
    assert (acme["allowed_now"], acme["allowed_draft"]) == (20, 60)
    assert (acme["newly_denied"], acme["newly_allowed"]) == (0, 2 * (BURST - 10))
    assert acme["blocked_by_draft"] == {}
    assert report["totals"]["allowed_draft"] == 2 * (BURST + BETA_BURST)


def test_the_series_shows_each_policys_denials_in_the_minute_they_happened(recorded):
    report = what_if({"tiers": {"std": {"team": bucket(4)}}}, WINDOW)
    assert report["step"] == 60 == series_step(WINDOW)
    start = report["window"]["start"]
    denials = {
        int(point["start"] - start) // 60: (point["denied_now"], point["denied_draft"])
        for point in report["series"]
        if point["decisions"]
    }
    assert denials == {1: (BURST - 10, BURST - 4), 3: (BURST - 10, BURST - 4)}
    assert len(report["series"]) == 5


# --- partial documents -------------------------------------------------------------------------------


def test_a_tenant_moved_to_another_tier_changes_that_tenant_alone(recorded):
    report = what_if({"tenants": {"beta": {"tier": "big"}, "acme": {"tier": "big"}}}, WINDOW)
    acme = tenant(report, "acme")
    assert (acme["tier_now"], acme["tier_draft"]) == ("std", "big")
    assert acme["allowed_draft"] == 2 * BURST  # 30 fit big's 50


def test_a_tier_given_one_level_keeps_its_other_levels(recorded):
    _, drafted = draft_policies({"tiers": {"std": {"team": bucket(4)}}})
    assert drafted.tiers["std"]["user"] == POLICY["tiers"]["std"]["user"]
    assert drafted.tiers["std"]["team"] == bucket(4)
    assert drafted.tiers["big"] == POLICY["tiers"]["big"]


def test_a_new_tenant_in_a_draft_takes_its_team_key_off_the_default_tier(recorded):
    report = what_if({"tenants": {"gamma": {"tier": "big"}}}, WINDOW)
    assert {row["tenant"] for row in report["tenants"]} == {"acme", "beta"}  # gamma sent nothing
    _, drafted = draft_policies({"tenants": {"gamma": {"tier": "big"}}})
    assert drafted.tenants["gamma"].tier == "big" and drafted.tenants["acme"].tier == "std"


def test_an_empty_draft_changes_nothing(recorded):
    report = what_if({}, WINDOW)
    assert report["totals"]["newly_denied"] == report["totals"]["newly_allowed"] == 0
    assert report["totals"]["allowed_now"] == report["totals"]["allowed_draft"] == 2 * (10 + BETA_BURST)


def test_levels_and_priority_classes_given_replace_those_of_the_same_name(policy):
    merged = merge_draft(
        export_policy(), {"levels": [{"name": "team", "fail_mode": "closed"}, "region"], "priorities": {"batch": {}}}
    )
    assert [level["name"] for level in merged["levels"]] == ["user", "team", "global", "region"]
    assert merged["levels"][1]["fail_mode"] == "closed"
    assert merged["priorities"] == {"batch": {}}


def test_a_tenants_override_levels_merge_with_those_it_has(load):
    doc = copy.deepcopy(POLICY)
    doc["tenants"]["acme"] = {"tier": "std", "overrides": {"user": bucket(7), "team": bucket(8)}}
    load(doc)
    _, drafted = draft_policies({"tenants": {"acme": {"overrides": {"team": []}}}})
    assert drafted.tenants["acme"].overrides == {"user": bucket(7)}
    assert drafted.tenants["acme"].tier == "std"


# --- refusals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "draft, path",
    [
        (
            {"tiers": {"std": {"team": [{"type": "token_bucket", "capacity": -1, "per_second": 1}]}}},
            "tiers.std.team[0].capacity",
        ),
        ({"tenants": {"acme": {"tier": "gold"}}}, "tenants.acme.tier"),
        ({"tiers": {"std": {"region": bucket(3)}}}, "tiers.std.region"),
        ({"tiers": {"new": {}}}, "tiers.new"),
        ({"tiers": 5}, "tiers"),
        ({"levels": [{"name": "team", "fail_mode": "sideways"}]}, "levels[0].fail_mode"),
        ({"tenats": {}}, "tenats"),
        ({"tiers": {"x" * 65: {"team": bucket(3)}}}, f"tiers.{'x' * 65}.name"),
        ({"alerts": {"a": {"kind": "quota_used", "threshold": 2, "url": "https://x.io/"}}}, "alerts.a.threshold"),
    ],
)
def test_a_bad_draft_is_refused_as_loadpolicies_refuses_the_same_document(policy, draft, path):
    before = snapshot()
    with pytest.raises(ConfigError) as refused:
        draft_policies(draft)
    assert refused.value.path == path, refused.value
    with pytest.raises(ConfigError) as loading:
        load_policy(merge_draft(export_policy(), draft))
    if not path.startswith("levels"):  # a draft's levels are checked alone, at the draft's own index
        assert (refused.value.path, refused.value.reason) == (loading.value.path, loading.value.reason)
    assert snapshot() == before


def test_alerts_in_a_draft_are_checked_and_play_no_part(recorded):
    alert = {"kind": "denied_share", "threshold": 0.1, "window": "5m", "url": "https://x.io/", "secret": "s"}
    with_alerts = what_if({"alerts": {"noisy": alert}}, WINDOW)
    assert with_alerts["totals"] == what_if({}, WINDOW)["totals"]


def test_a_draft_writes_nothing(recorded):
    before, version = snapshot(), read_policy().version
    what_if({"tiers": {"std": {"team": bucket(4)}}, "tenants": {"gamma": {"tier": "big"}}}, WINDOW)
    assert snapshot() == before and read_policy().version == version


# --- an empty window, recording off --------------------------------------------------------------------


def test_an_empty_window_answers_zeros(policy, recorder):
    report = what_if({"tiers": {"std": {"team": bucket(4)}}}, 3600)
    assert report["replayed"] == 0 and report["tenants"] == [] and report["tenants_total"] == 0
    assert report["totals"] == {
        "decisions": 0,
        "allowed_now": 0,
        "allowed_draft": 0,
        "newly_denied": 0,
        "newly_allowed": 0,
        "blocked_by_draft": {},
        "blocked_by_now": {},
    }
    assert len(report["series"]) == 60 and all(point["decisions"] == 0 for point in report["series"])


def test_records_older_than_the_window_are_not_replayed(recorded, clock):
    clock.advance(BURSTS_AT[1])  # the second burst is now WINDOW - 1 - ... seconds back; the first is out
    report = what_if({}, WINDOW)
    assert report["totals"]["decisions"] == BURST + BETA_BURST


def test_with_recording_off_it_answers_zeros_and_says_so(policy):
    install_decision_recorder(None)
    try:
        report = what_if({"tiers": {"std": {"team": bucket(4)}}}, 600)
    finally:
        reset_decision_recorder()
    assert report["recording"] is False and report["replayed"] == 0


# --- the command line ---------------------------------------------------------------------------------


def test_the_command_prints_the_same_as_a_table(recorded, tmp_path, capsys):
    draft = tmp_path / "draft.yaml"
    draft.write_text("tiers:\n  std:\n    team:\n      - {type: token_bucket, capacity: 4, per_second: 1}\n")
    call_command("whatif", str(draft), "--window", "5m")
    out = capsys.readouterr().out
    assert out == what_if_table(what_if({"tiers": {"std": {"team": bucket(4)}}}, WINDOW))
    acme_row = next(line for line in out.splitlines() if line.startswith("acme"))
    assert acme_row.split()[:8] == ["acme", "std", "std", "60", "20", "8", "12", "0"]
    assert "(all)" in out


def test_the_command_refuses_a_bad_file_as_loadpolicies_does(policy, tmp_path):
    draft = tmp_path / "draft.yaml"
    draft.write_text("tiers:\n  std:\n    team:\n      - {type: token_bucket, capacity: -1, per_second: 1}\n")
    with pytest.raises(CommandError) as refused:
        call_command("whatif", str(draft))
    assert str(refused.value).startswith(f"{draft}: tiers.std.team[0].capacity: ")
    whole = tmp_path / "whole.yaml"
    whole.write_text(draft.read_text() + "default_tier: std\n")
    with pytest.raises(CommandError) as loading:
        call_command("loadpolicies", str(whole))
    assert str(refused.value).split(": ", 2)[2] == str(loading.value).split(": ", 2)[2]


def test_the_command_refuses_a_bad_window(policy, tmp_path):
    draft = tmp_path / "draft.yaml"
    draft.write_text("{}\n")
    with pytest.raises(CommandError, match="--window must be a duration from 1s to 24h"):
        call_command("whatif", str(draft), "--window", "2d")


# --- quotas replay like any rule ------------------------------------------------------------------


def test_a_drafted_daily_quota_denies_what_passes_it_and_a_soft_one_denies_nothing(recorded):
    hard = {"type": "quota", "limit": 15, "period": "day"}
    report = what_if({"tiers": {"std": {"team": [*bucket(50), hard]}}}, WINDOW)
    acme = tenant(report, "acme")
    # The bucket of 50 holds each burst of 30; the day's 15 are spent in the first one.
    assert (acme["allowed_now"], acme["allowed_draft"]) == (20, 15)
    assert acme["blocked_by_draft"] == {"team: quota(15/day)": 2 * BURST - 15}
    assert tenant(report, "beta")["allowed_draft"] == 2 * BETA_BURST  # 6 of its own 15
    soft = {**hard, "mode": "soft"}
    report = what_if({"tiers": {"std": {"team": [*bucket(50), soft]}}}, WINDOW)
    assert tenant(report, "acme")["allowed_draft"] == 2 * BURST
    assert report["totals"]["blocked_by_draft"] == {}


# --- tenants a tier's change does not reach (issue 25) --------------------------------------------


def test_a_tenant_overriding_the_changed_level_is_named_as_unaffected(load):
    from policies.admin.whatif import shielded_tenants
    from tests.policies.conftest import POLICY as SPEC

    load(copy.deepcopy(SPEC))  # bigco (pro) overrides the team level until 2026-12-31
    now = START.timestamp()
    team_only = {"tiers": {"pro": {"team": bucket(10, 5)}}}
    assert shielded_tenants(*draft_policies(team_only), "pro", now) == {
        "bigco": {"overridden": ["team"], "reached": []}
    }
    both_levels = {"tiers": {"pro": {"team": bucket(10, 5), "user": bucket(5, 5)}}}
    assert shielded_tenants(*draft_policies(both_levels), "pro", now) == {
        "bigco": {"overridden": ["team"], "reached": ["user"]}
    }
    assert shielded_tenants(*draft_policies({"tiers": {"pro": {"user": bucket(5, 5)}}}), "pro", now) == {}
    assert shielded_tenants(*draft_policies({"tiers": {"free": {"team": bucket(5, 5)}}}), "free", now) == {}
    after = dt.datetime(2027, 1, 1, tzinfo=dt.UTC).timestamp()  # the override has ended: reached
    assert shielded_tenants(*draft_policies(team_only), "pro", after) == {}


# --- the command without REDIS_URL: the record is the server's (issue 25) -------------------------


def test_with_the_record_in_this_process_the_command_says_why_it_sees_nothing_and_what_to_do(
    policy, recorder, tmp_path
):
    draft = tmp_path / "draft.yaml"
    draft.write_text("{}\n")
    out, err = io.StringIO(), io.StringIO()
    call_command("whatif", str(draft), stdout=out, stderr=err)
    assert out.getvalue().startswith("What if: 0 recorded requests")
    note = err.getvalue()
    assert "without REDIS_URL" in note and "cannot read" in note
    for remedy in ("--server http://127.0.0.1:8000", "LIMITER_TOKEN", "Preview impact", "POST /api/v1/whatif"):
        assert remedy in note


def test_with_the_record_in_redis_the_command_reads_it_and_adds_no_note(policy, redis_url, clock, tmp_path):
    import redis

    client = redis.Redis.from_url(redis_url)
    recorder = DecisionRecorder(client=client, url=redis_url, clock=clock, flush_every=None)
    install_decision_recorder(recorder)
    try:
        for i in range(BETA_BURST):
            recorder.decision({"user": f"u{i}", "team": "beta", "global": "*"}, 1, None, _allowed())
        draft = tmp_path / "draft.yaml"
        draft.write_text("{}\n")
        out, err = io.StringIO(), io.StringIO()
        call_command("whatif", str(draft), "--window", "5m", stdout=out, stderr=err)
    finally:
        reset_decision_recorder()
        client.close()
    assert out.getvalue().startswith(f"What if: {BETA_BURST} recorded requests")
    assert err.getvalue() == ""


def test_asking_a_server_needs_an_admin_token_in_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("LIMITER_TOKEN", raising=False)
    draft = tmp_path / "draft.yaml"
    draft.write_text("{}\n")
    with pytest.raises(CommandError, match=r"--server needs an admin-scope token in LIMITER_TOKEN: .*--scope admin"):
        call_command("whatif", str(draft), "--server", "http://127.0.0.1:8000")


@pytest.mark.parametrize(
    ("url", "message"),
    [("ftp://127.0.0.1/", "--server base_url must be an http:// or https:// URL"), (None, "no answer from the server")],
)
def test_a_server_that_is_no_url_or_does_not_answer_is_a_clear_error(monkeypatch, tmp_path, url, message):
    from tests.serving import free_port

    monkeypatch.setenv("LIMITER_TOKEN", "la_0_token")
    draft = tmp_path / "draft.yaml"
    draft.write_text("{}\n")
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("whatif", str(draft), "--server", url or f"http://127.0.0.1:{free_port()}")


SERVED_POLICY = {
    "default_tier": "t",
    "levels": [{"name": "team"}],
    "tiers": {"t": {"team": [{"type": "token_bucket", "capacity": 50, "per_second": 0}]}},
}


@pytest.fixture(scope="module")
def served():
    """gunicorn as `make run` serves without REDIS_URL: the record lives in its one worker."""
    from tests.serving import Service

    with Service(SERVED_POLICY, scope="admin") as service:
        for _ in range(20):
            assert service.post("/api/v1/decisions", {"keys": {"team": "acme"}})[1]["allowed"] is True
        yield service


def whatif_command(service, draft, *options: str, token: str | None = None) -> subprocess.CompletedProcess:
    env = {**service.env, "LIMITER_TOKEN": token if token is not None else service.token}
    return subprocess.run(
        [sys.executable, "manage.py", "whatif", str(draft), "--window", "5m", *options],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_the_command_asks_the_running_server_for_what_it_recorded(served, tmp_path):
    """Issue 25: under `make run` without REDIS_URL the command saw "0 recorded requests"."""
    draft = tmp_path / "draft.yaml"
    draft.write_text("tiers:\n  t:\n    team: [{type: token_bucket, capacity: 5, per_second: 0}]\n")
    alone = whatif_command(served, draft)
    assert alone.returncode == 0 and alone.stdout.startswith("What if: 0 recorded requests")
    assert "--server" in alone.stderr
    asked = whatif_command(served, draft, "--server", f"http://127.0.0.1:{served.port}")
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.startswith("What if: 20 recorded requests") and asked.stderr == ""
    acme = next(line for line in asked.stdout.splitlines() if line.startswith("acme"))
    assert acme.split()[:8] == ["acme", "t", "t", "20", "20", "5", "15", "0"]


@pytest.mark.slow
def test_the_server_refuses_a_bad_draft_as_the_command_does_alone(served, tmp_path):
    draft = tmp_path / "draft.yaml"
    draft.write_text("tiers:\n  t:\n    team: [{type: token_bucket, capacity: -1, per_second: 0}]\n")
    asked = whatif_command(served, draft, "--server", f"http://127.0.0.1:{served.port}")
    alone = whatif_command(served, draft)
    assert asked.returncode == alone.returncode == 1
    refusal = f"{draft}: tiers.t.team[0].capacity: "
    assert refusal in asked.stderr and asked.stderr.strip().splitlines()[-1] == alone.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_token_without_the_admin_scope_is_told_so(served, tmp_path):
    decide = served.manage("createservicetoken", "gateway", "--scope", "decide").strip().splitlines()[-1]
    draft = tmp_path / "draft.yaml"
    draft.write_text("{}\n")
    asked = whatif_command(served, draft, "--server", f"http://127.0.0.1:{served.port}", token=decide)
    assert asked.returncode == 1
    assert "answered 403" in asked.stderr and "admin-scope token of that server" in asked.stderr
