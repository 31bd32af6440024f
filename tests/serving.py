"""Run the real service, as `make run` does, for end-to-end tests and benchmarks: a fresh
SQLite database, migrated and loaded with a policy, a service token, and gunicorn (or, with
`server="uvicorn"`, uvicorn's ASGI workers) on a free loopback port. Load goes to 127.0.0.1
only.

    with Service(policy, redis_url=url, workers=4) as service:
        status, body = service.post("/api/v1/decisions", {"keys": {"team": "t"}})
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def stop_group(process: subprocess.Popen | None) -> None:
    """Stop a server started with `start_new_session=True` and all its children: SIGTERM to its
    process group, SIGKILL after 10 s."""
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


class Service:
    """gunicorn serving limiter_admin with its own database (and Redis, if given)."""

    def __init__(
        self,
        policy: dict,
        redis_url: str | None = None,
        workers: int = 1,
        threads: int = 8,
        extra_env: dict | None = None,
        scope: str = "decide",
        root: Path = ROOT,
        server: str = "gunicorn",
        worker_class: str | None = None,
        app: str = "limiter_admin.wsgi",
    ) -> None:
        """`root`: the checkout to serve (bench/ compares this one with another). `server`:
        "gunicorn" (WSGI, `threads` per worker), "granian" (WSGI, `threads` blocking threads a
        worker, as bin/serve serves the gateways' pool; `app` module:attribute) or "uvicorn"
        (ASGI, one event loop a worker).
        `worker_class`: gunicorn's `-k` (None: what limiter_admin/gunicorn_conf.py says, else
        gunicorn's default); `app`: the application gunicorn loads (an ASGI worker class needs
        `limiter_admin.asgi:application`)."""
        self.server = server
        self.root = Path(root)
        self.directory = tempfile.TemporaryDirectory(prefix="limiter-e2e-")
        self.port = free_port()
        self.workers, self.threads = workers, threads
        self.worker_class, self.app = worker_class, app
        self.env = {
            **os.environ,
            "DATABASE_URL": f"sqlite:///{self.directory.name}/db.sqlite3",
            "DEBUG": "0",
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "SECRET_KEY": "e2e-" + "x" * 60,
            "DJANGO_SETTINGS_MODULE": "limiter_admin.settings",
            **(extra_env or {}),
        }
        self.env.pop("REDIS_URL", None)
        if redis_url:
            self.env["REDIS_URL"] = redis_url
        self.policy, self.scope = policy, scope
        self.process: subprocess.Popen | None = None
        self.token = ""
        self._log_name = "gunicorn.log"

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def start(self) -> Service:
        policy_file = Path(self.directory.name) / "policy.json"
        policy_file.write_text(json.dumps(self.policy))
        self.manage("migrate", "--noinput")
        self.manage("loadpolicies", str(policy_file))
        self.token = self.manage("createservicetoken", "e2e", "--scope", self.scope).strip().splitlines()[-1]
        return self.serve()

    def sibling(self, workers: int = 1, threads: int = 8, extra_env: dict | None = None) -> Service:
        """A second gunicorn on this one's database, Redis and token (another pool of workers,
        as docs/OPERATIONS.md runs the gateways' apart from the console's), started. Stop it
        before this one, which owns the database."""
        other = Service(
            self.policy,
            workers=workers,
            threads=threads,
            scope=self.scope,
            root=self.root,
            server=self.server,
            worker_class=self.worker_class,
            app=self.app,
        )
        other.directory.cleanup()
        other.directory = self.directory
        other.env = {**self.env, **(extra_env or {})}
        other.token = self.token
        other._log_name = f"gunicorn-{other.port}.log"
        return other.serve()

    def command(self) -> list[str]:
        """The command line that `serve` runs: granian's (bin/serve's flags), uvicorn's, or
        gunicorn's."""
        # Where granian and uvicorn listen, and how many workers they start, in their words.
        listening = ["--host", "127.0.0.1", "--port", str(self.port), "--workers", str(self.workers)]
        if self.server == "granian":
            # No gunicorn hooks here: its workers' Prometheus files go to a directory of our own.
            metrics = Path(self.directory.name) / "metrics"
            metrics.mkdir(exist_ok=True)
            self.env.setdefault("PROMETHEUS_MULTIPROC_DIR", str(metrics))
            return [
                sys.executable,
                "-m",
                "granian",
                "--interface",
                "wsgi",
                self.app.replace(".wsgi", ".wsgi:application") if ":" not in self.app else self.app,
                *listening,
                "--blocking-threads",
                str(self.threads),
                "--no-ws",
                "--respawn-failed-workers",
                "--workers-kill-timeout",
                "5",
                "--log-level",
                "warning",
            ]
        if self.server == "uvicorn":
            return [
                sys.executable,
                "-m",
                "uvicorn",
                "limiter_admin.asgi:application",
                *listening,
                "--no-access-log",
            ]
        # gunicorn turns `sync` with more than one thread into gthread, even when asked for by
        # name (its Config.worker_class): a sync worker is asked for with one thread.
        threads = 1 if self.worker_class == "sync" else self.threads
        kind = ["-k", self.worker_class] if self.worker_class else []
        return [
            sys.executable,
            "-m",
            "gunicorn",
            self.app,
            "-c",
            "python:limiter_admin.gunicorn_conf",
            "-b",
            f"127.0.0.1:{self.port}",
            "-w",
            str(self.workers),
            "--threads",
            str(threads),
            *kind,
        ]

    def serve(self) -> Service:
        """gunicorn on this database, until stopped."""
        self.log = open(Path(self.directory.name) / self._log_name, "w")
        self.process = subprocess.Popen(
            self.command(),
            cwd=self.root,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_until_ready()
        return self

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.server} exited at start-up:\n{self.read_log()}")
            try:
                if self.get("/healthz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)  # start-up polling, not an edge under test
        self.stop()
        raise RuntimeError(f"{self.server} did not answer within {STARTUP_TIMEOUT} s:\n{self.read_log()}")

    def read_log(self) -> str:
        path = Path(self.directory.name) / self._log_name
        return path.read_text()[-4000:] if path.exists() else ""

    def connection(self, timeout: float = 10.0) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(
        self, method: str, path: str, body: dict | None = None, connection: http.client.HTTPConnection | None = None
    ) -> tuple[int, dict]:
        own = connection is None
        connection = connection or self.connection()
        try:
            headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
            connection.request(method, path, json.dumps(body) if body is not None else None, headers)
            response = connection.getresponse()
            raw = response.read()
            return response.status, json.loads(raw) if raw.startswith((b"{", b"[")) else {}
        finally:
            if own:
                connection.close()

    def get(self, path: str) -> tuple[int, dict]:
        return self.request("GET", path)

    def post(self, path: str, body: dict, connection=None) -> tuple[int, dict]:
        return self.request("POST", path, body, connection)

    def worker_pids(self) -> list[int]:
        done = subprocess.run(["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True)
        return [int(pid) for pid in done.stdout.split()]

    def stop(self) -> None:
        stop_group(self.process)
        self.process = None

    def __enter__(self) -> Service:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        if hasattr(self, "log"):
            self.log.close()
        self.directory.cleanup()
