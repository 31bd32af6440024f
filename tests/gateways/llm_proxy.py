"""A real LiteLLM proxy (litellm[proxy]==1.106.12, from its own virtualenv: `.venv-litellm`,
made by `make test`) configured from docs/LLM_GATEWAYS.md, with models that LiteLLM answers
itself (`mock_response`): nothing leaves the machine.

    with LiteLLM(service, workers=1) as proxy:
        status, headers, body = proxy.chat({"messages": [...], "max_tokens": 50}, team="acme")
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from tests.gateways.running import fill
from tests.serving import ROOT, Service, free_port, stop_group

VENV = ROOT / ".venv-litellm"
DOC = ROOT / "docs" / "LLM_GATEWAYS.md"
MODEL = "gpt-test"
# Two more models for the tests alone, added to the documented configuration: one that takes
# SLOW_DELAY seconds before it answers, one that fails (LiteLLM refuses mock parameters in a
# request's body, so they are the deployment's).
SLOW_MODEL, FAILING_MODEL, SLOW_DELAY = "slow-test", "failing-test", 6
MOCK_RESPONSE = "A mocked answer of a few tokens."
MASTER_KEY = "sk-" + "5e" * 32  # LiteLLM refuses to start without one; no database here
STARTUP_TIMEOUT = 90.0
DOCUMENTED = "as documented"  # LiteLLM imports a great deal before it listens


def documented() -> str:
    """The YAML block after `<!-- tested: litellm -->` in docs/LLM_GATEWAYS.md."""
    found = re.search(r"<!-- tested: litellm -->\n```yaml\n(.*?)\n```", DOC.read_text(), re.S)
    if found is None:
        raise LookupError(f"no block marked 'tested: litellm' in {DOC}")
    return found.group(1) + "\n"


class LiteLLM:
    """The proxy, started from the documented configuration, in front of the `service`."""

    def __init__(
        self, service: Service, workers: int = 1, extra_env: dict | None = None, callback: str | None = DOCUMENTED
    ) -> None:
        """`callback`: another callback than the documented one, or None for none
        (bench/litellm.py compares them)."""
        self.service, self.workers = service, workers
        self.directory = tempfile.TemporaryDirectory(prefix="litellm-")
        self.port = free_port()
        self.config = Path(self.directory.name) / "config.yaml"
        config = yaml.safe_load(
            fill(documented(), {"MODEL": MODEL, "UPSTREAM_KEY": "sk-nothing-leaves", "MOCK_RESPONSE": MOCK_RESPONSE})
        )
        [model] = config["model_list"]
        for name, extra in (
            (SLOW_MODEL, {"mock_delay": SLOW_DELAY}),
            (FAILING_MODEL, {"mock_response": "litellm.InternalServerError"}),
        ):
            params = {**model["litellm_params"], "model": f"openai/{name}", **extra}
            config["model_list"].append({"model_name": name, "litellm_params": params})
        if callback is None:
            del config["litellm_settings"]["callbacks"]
        elif callback != DOCUMENTED:
            config["litellm_settings"]["callbacks"] = callback
        self.config.write_text(yaml.safe_dump(config))
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "DATABASE", "REDIS"))},
            "PYTHONPATH": str(ROOT),
            "LIMITER_URL": f"http://127.0.0.1:{service.port}",
            "LIMITER_TOKEN": service.token,
            "LITELLM_LOG": "ERROR",
            "LITELLM_TELEMETRY": "False",
            # Its model cost map from the package, not fetched from GitHub: nothing leaves the machine.
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "DISABLE_SCHEMA_UPDATE": "true",
            "LITELLM_MASTER_KEY": MASTER_KEY,
            **(extra_env or {}),
        }
        self.process: subprocess.Popen | None = None
        self.log = Path(self.directory.name) / "litellm.log"

    def __enter__(self) -> LiteLLM:
        if not (VENV / "bin" / "litellm").exists():
            raise RuntimeError(f"no LiteLLM in {VENV}: `make test` makes it (requirements-litellm.txt)")
        command = [
            str(VENV / "bin" / "litellm"),
            "--config",
            str(self.config),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--num_workers",
            str(self.workers),
        ]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                command,
                cwd=self.directory.name,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"LiteLLM exited: {self.read_log()[-4000:]}")
            try:
                status, _, _ = self.request("GET", "/health/liveliness")
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"LiteLLM did not start in {STARTUP_TIMEOUT:.0f} s: {self.read_log()[-4000:]}")

    def __exit__(self, *exc: object) -> None:
        stop_group(self.process)
        self.directory.cleanup()

    def read_log(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def request(
        self, method: str, path: str, body: dict | None = None, headers: dict | None = None, timeout: float = 30.0
    ) -> tuple[int, dict, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            fields = {"Content-Type": "application/json", "Authorization": f"Bearer {MASTER_KEY}", **(headers or {})}
            connection.request(method, path, json.dumps(body) if body is not None else None, fields)
            response = connection.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            connection.close()

    def call(self, path: str, body: dict, team: str | None = "acme", **headers: str) -> tuple[int, dict, dict]:
        """POST `body` (MODEL unless it names one) to `path` as the team; (status, headers,
        JSON, or {"raw": text} for a stream)."""
        fields = dict(headers)
        if team is not None:
            fields["x-limiter-team"] = team
        status, answer_headers, raw = self.request("POST", path, {"model": MODEL, **body}, fields)
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {"raw": raw.decode(errors="replace")}
        return status, answer_headers, answer

    def chat(self, body: dict, team: str | None = "acme", **headers: str) -> tuple[int, dict, dict]:
        return self.call("/v1/chat/completions", body, team, **headers)
