"""The README's examples run as written, against the real service on the demo policies."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.serving import ROOT, Service

README = ROOT / "README.md"
DEMO = ROOT / "policies" / "fixtures" / "demo.yaml"


def section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.DOTALL)


@pytest.fixture(scope="module")
def demo():
    """gunicorn serving the demo policies, as `make run` does."""
    with Service(yaml.safe_load(DEMO.read_text())) as service:
        yield service


@pytest.mark.slow
def test_calling_the_api_takes_a_concurrency_slot_and_gives_it_back(demo):
    """Issue 25: the README's first example never mentioned leases, and the demo's concurrency
    rule locked a tenant out within 30 s. Its commands, run as a script: the decision holds a
    slot, and the release the README shows gives it back."""
    text = section("Calling the API")
    script = "\n".join(blocks(text, "sh"))
    script = script.replace("http://127.0.0.1:8000", f"http://127.0.0.1:{demo.port}")
    script = script.replace(".venv/bin/python", sys.executable)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=demo.env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    decision, release = (json.loads(line) for line in done.stdout.splitlines())
    shown_decision, shown_release = (json.loads(block) for block in blocks(text, "json"))
    assert list(decision) == list(shown_decision)  # the README shows every field, in order
    assert decision["allowed"] is True and decision["remaining"] == shown_decision["remaining"] == 63
    assert decision["lease"]
    assert release == {"id": decision["lease"], "status": "released", "released": 1}
    assert list(release) == list(shown_release)
    # The slot is back: a dry run finds all 64 free again.
    status, dry = demo.post("/api/v1/decisions", {"keys": {"team": "umbrella"}, "dry_run": True})
    assert status == 200, dry
    [slots] = [rule for rule in dry["rules"] if rule["label"] == "CONCURRENCY_LIMIT"]
    assert slots["rule"].startswith("concurrency(64, lease 120s)") and slots["remaining"] == 64


def test_the_readme_names_the_demo_tiers_concurrency_rule_as_the_demo_has_it():
    enterprise = yaml.safe_load(DEMO.read_text())["tiers"]["enterprise"]["team"]
    [rule] = [rule for rule in enterprise if rule["type"] == "concurrency"]
    assert f"concurrency({rule['limit']}, lease {rule['lease']}s)" in section("Calling the API")
    assert "Concurrency rules behind a gateway" in Path(ROOT / "docs" / "GATEWAYS.md").read_text()
