"""A real redis-server on loopback for the tests that need one.

The suite starts its own server (never a fake of one): one for the whole session, emptied
before each test that asks for `redis_url`, and, for the fault tests, a disposable server
per test that may be killed and started again without touching the shared one.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

import pytest
import redis

STARTUP_TIMEOUT = 10.0  # seconds for a fresh server to answer PING


def free_port() -> int:
    """A loopback port that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def redis_server_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not on PATH: the Redis store's tests need a real server "
                    "(install it, e.g. `apt-get install redis-server`, as .ci/run does)",
                    pytrace=False)
    return binary


class RedisServer:
    """One redis-server process on 127.0.0.1:`port`, with no persistence unless `options`
    say otherwise (e.g. `("--appendonly", "yes")`), that a test may kill (SIGKILL), freeze
    (SIGSTOP), shut down cleanly and start again on the same port and directory."""

    def __init__(self, directory: str, port: int | None = None, options: tuple[str, ...] = ()) -> None:
        self.binary = redis_server_binary()
        self.directory = str(directory)
        self.port = port or free_port()
        self.options = tuple(options)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **options) -> redis.Redis:
        """A client of our own, separate from whatever the code under test uses."""
        return redis.Redis(host="127.0.0.1", port=self.port, **options)

    def start(self) -> "RedisServer":
        assert self.process is None, "the server is already running"
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.directory,
             "--logfile", os.path.join(self.directory, "redis.log"), *self.options],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_for_ping()
        return self

    def kill(self) -> None:
        """SIGKILL: the server is gone at once, as in a crash; its data goes with it."""
        if self.process is not None:
            self.thaw()
            self.process.kill()
            self.process.wait()
            self.process = None

    def shutdown(self) -> None:
        """SIGTERM: a clean stop, as `systemctl stop` does; with AOF on, everything written
        so far is on disk when it exits."""
        if self.process is not None:
            self.thaw()
            self.process.terminate()
            self.process.wait(STARTUP_TIMEOUT)
            self.process = None

    def freeze(self) -> None:
        """SIGSTOP: the port still accepts connections but nothing is ever answered."""
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        self.kill()
        self.start()

    def _wait_for_ping(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        client = self.client(socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            while True:
                if self.process.poll() is not None:
                    log = os.path.join(self.directory, "redis.log")
                    tail = open(log).read()[-2000:] if os.path.exists(log) else ""
                    self.process = None
                    pytest.fail(f"redis-server on port {self.port} exited at start-up:\n{tail}",
                                pytrace=False)
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    self.kill()
                    pytest.fail(f"redis-server on port {self.port} did not answer PING "
                                f"within {STARTUP_TIMEOUT} s", pytrace=False)
                time.sleep(0.01)  # start-up polling, not an edge: any pace will do
        finally:
            client.close()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """The session's redis-server, started on first use and killed at the end."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.kill()


@pytest.fixture
def redis_url(redis_server):
    """The session server's URL, emptied of keys and scripts before the test."""
    client = redis_server.client()
    client.flushall()
    client.script_flush()
    client.close()
    return redis_server.url


@pytest.fixture
def unreachable_redis_url():
    """A Redis URL on loopback where nothing listens."""
    return f"redis://127.0.0.1:{free_port()}/0"


@pytest.fixture
def disposable_redis(tmp_path):
    """A redis-server of this test's own, which it may kill and restart at will."""
    server = RedisServer(tmp_path).start()
    yield server
    server.kill()
