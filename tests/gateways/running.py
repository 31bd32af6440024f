"""Real nginx (Debian nginx-light) and Caddy (Debian caddy) for the forward-auth tests and
benchmarks, configured from docs/GATEWAYS.md, and a small upstream that counts what reaches
it. Loopback ports only; everything started here stops with its context.

    alice = Caller("key-of-alice", "acme", "alice")
    with Upstream() as upstream, Nginx(limiter_port, upstream.port, token, {"alice": alice}) as nginx:
        status, headers, body = nginx.get("/", {"X-Api-Key": alice.key})
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import string
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple

from tests.serving import ROOT, free_port, stop_group

GATEWAYS = ROOT / "docs" / "GATEWAYS.md"
STARTUP_TIMEOUT = 20.0


def documented(name: str) -> str:
    """The fenced block that follows `<!-- tested: name -->` in docs/GATEWAYS.md."""
    found = re.search(rf"<!-- tested: {re.escape(name)} -->\n```\w*\n(.*?)\n```", GATEWAYS.read_text(), re.S)
    if found is None:
        raise LookupError(f"no block marked 'tested: {name}' in {GATEWAYS}")
    return found.group(1) + "\n"


def fill(text: str, values: dict) -> str:
    """`${NAME}` placeholders filled in; every value must have its placeholder, and no
    `${...}` may be left (nginx's own `$variables` stay as they are)."""
    for name in values:
        if "${" + name + "}" not in text:
            raise LookupError(f"no ${{{name}}} in the documented configuration")
    filled = string.Template(text).safe_substitute({name: str(value) for name, value in values.items()})
    left = re.findall(r"\$\{\w+\}", filled)
    if left:
        raise LookupError(f"placeholders the tests do not fill: {left}")
    return filled


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


def team_remaining(service, team: str) -> float:
    """The room left at a team's level (and the global one), by a dry run over REST."""
    status, body = service.post("/api/v1/decisions", {"keys": {"team": team}, "dry_run": True})
    if status not in (200, 429):
        raise RuntimeError(f"a dry run for team {team!r} answered {status}: {body}")
    return body["remaining"]


HELD = "/held/"
HOLD_TIMEOUT = 30.0


class Upstream:
    """An HTTP server that answers 200 to anything, with the request's x-limiter-* header
    fields as its JSON body, and counts the requests that reached it by path (`hits`).

    A long request: one to `/held/<name>` is answered only once `finish(name)` is called
    (within HOLD_TIMEOUT); `arrived(name)` waits until it has reached the upstream."""

    def __init__(self) -> None:
        self.hits: dict[str, int] = {}
        self.reached: dict[str, threading.Event] = {}
        self.finished: dict[str, threading.Event] = {}
        lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # Head and body go out in two writes: without this, Nagle holds the body.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def answer(self) -> None:
                with lock:
                    upstream.hits[self.path] = upstream.hits.get(self.path, 0) + 1
                if self.path.startswith(HELD):
                    name = self.path[len(HELD) :]
                    upstream.event(upstream.reached, name).set()
                    upstream.event(upstream.finished, name).wait(HOLD_TIMEOUT)
                seen = {k.lower(): v for k, v in self.headers.items() if k.lower().startswith("x-limiter")}
                body = json.dumps(seen).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # a long request whose client went away meanwhile

            do_GET = do_POST = answer  # noqa: N815  (http.server's names)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def event(self, events: dict[str, threading.Event], name: str) -> threading.Event:
        return events.setdefault(name, threading.Event())  # one step: safe across threads

    def arrived(self, name: str, timeout: float = HOLD_TIMEOUT) -> bool:
        """Whether the long request `name` reached the upstream within `timeout` seconds."""
        return self.event(self.reached, name).wait(timeout)

    def finish(self, name: str) -> None:
        """Answer the long request `name` (now, or as soon as it comes)."""
        self.event(self.finished, name).set()

    @property
    def total(self) -> int:
        """The requests that reached it, whatever their path."""
        return sum(self.hits.values())

    def __enter__(self) -> Upstream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for event in list(self.finished.values()):
            event.set()  # no long request outlives its test
        self.server.shutdown()
        self.server.server_close()


class Caller(NamedTuple):
    """A client the gateway knows by its API key (`X-Api-Key`), and the team and user keys the
    gateway decides on for it: the operator's API key file holds one line per caller."""

    key: str
    team: str
    user: str


class Gateway:
    """A gateway process on a free loopback port, started with the documented configuration
    (`config`: the file it reads) beside the API key file of its `callers`, stopped with its
    context."""

    name = ""

    def __init__(
        self, limiter_port: int, upstream_port: int, token: str, callers: Mapping[str, Caller] | None = None
    ) -> None:
        """`callers`: the clients the gateway knows, by a label of the test's choosing."""
        self.port = free_port()
        self.directory = tempfile.TemporaryDirectory(prefix=f"{self.name}-")
        self.home = Path(self.directory.name)
        self.callers = dict(callers or {})
        self.values = {
            "LISTEN_PORT": self.port,
            "LIMITER_PORT": limiter_port,
            "UPSTREAM_PORT": upstream_port,
            "LIMITER_TOKEN": token,
        }
        self.process: subprocess.Popen | None = None

    def command(self) -> tuple[list[str], dict]:
        raise NotImplementedError

    def api_keys(self) -> str:
        """The API key file's text, in the gateway's own syntax."""
        raise NotImplementedError

    def start(self) -> Gateway:
        for caller in self.callers.values():
            if not re.fullmatch(r"[\w.-]+", "".join(caller)):
                raise ValueError(f"{caller}: keys, teams and users of letters, digits, '-', '_' and '.' only")
        command, env = self.command()
        self.log_path = self.home / "gateway.log"
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.home, start_new_session=True
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start-up:\n{self.log_path.read_text()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.02)  # start-up polling, not an edge under test
        self.stop()
        raise RuntimeError(f"{self.name} not listening within {STARTUP_TIMEOUT} s:\n{self.log_path.read_text()}")

    def get(self, path: str = "/", headers: dict | None = None) -> tuple[int, dict, bytes]:
        return request(self.port, "GET", path, headers)

    def stop(self) -> None:
        stop_group(self.process)
        self.process = None

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.directory.cleanup()


class Nginx(Gateway):
    """nginx (`auth_request`), docs/GATEWAYS.md's whole nginx.conf: in the foreground, its pid
    and temporary files under the test's own directory (`-p`)."""

    name = "nginx"

    def command(self) -> tuple[list[str], dict]:
        config = self.home / "nginx.conf"
        config.write_text(fill(documented("nginx.conf"), self.values))
        (self.home / "api_keys.map").write_text(self.api_keys())
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        return [binary, "-p", str(self.home), "-c", str(config), "-e", "stderr"], dict(os.environ)

    def api_keys(self) -> str:
        return "".join(f'"{caller.key}" "{caller.team}/{caller.user}";\n' for caller in self.callers.values())


class Caddy(Gateway):
    """Caddy (`forward_auth`), docs/GATEWAYS.md's whole Caddyfile; its state (autosave, the
    local CA it would make) under the test's own directory."""

    name = "caddy"

    def command(self) -> tuple[list[str], dict]:
        config = self.home / "Caddyfile"
        config.write_text(fill(documented("Caddyfile"), self.values))
        (self.home / "api_keys.caddy").write_text(self.api_keys())
        env = {
            **os.environ,
            "HOME": str(self.home),
            "XDG_CONFIG_HOME": str(self.home / "config"),
            "XDG_DATA_HOME": str(self.home / "data"),
        }
        binary = shutil.which("caddy") or "/usr/bin/caddy"
        return [binary, "run", "--config", str(config), "--adapter", "caddyfile"], env

    def api_keys(self) -> str:
        return "".join(f"{caller.key} {caller.team} {caller.user}\n" for caller in self.callers.values())
