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

# `--database=postgres` and the PostgreSQL server it runs the tests on.
pytest_plugins = ["tests.postgres"]

STARTUP_TIMEOUT = 10.0  # seconds for a fresh server to answer PING


def free_port() -> int:
    """A loopback port that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def redis_server_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(
            "redis-server is not on PATH: the Redis store's tests need a real server "
            "(install it, e.g. `apt-get install redis-server`, as .ci/run does)",
            pytrace=False,
        )
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

    def start(self) -> RedisServer:
        assert self.process is None, "the server is already running"
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.directory,
                "--logfile",
                os.path.join(self.directory, "redis.log"),
                *self.options,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
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
                    pytest.fail(f"redis-server on port {self.port} exited at start-up:\n{tail}", pytrace=False)
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    self.kill()
                    pytest.fail(
                        f"redis-server on port {self.port} did not answer PING within {STARTUP_TIMEOUT} s",
                        pytrace=False,
                    )
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


class RedisClusterServers:
    """A real Redis Cluster on loopback: `primaries` primaries with one replica each, every
    node a redis-server of its own (RedisServer, so a test may kill one), slots spread by
    `redis-cli --cluster create`. Node timeout is short (1 s) so that a failover happens
    within a test's time."""

    NODE_TIMEOUT_MS = 1000

    def __init__(self, directory, primaries: int = 3) -> None:
        self.nodes = []
        # Two ports per node (the clients' and the cluster bus'; else the bus is port + 10,000,
        # maybe taken), all different: free_port() may hand out a port twice until it is bound.
        ports: set[int] = set()
        while len(ports) < primaries * 4:
            ports.add(free_port())
        ports_left = sorted(ports)
        for i in range(primaries * 2):
            node_dir = os.path.join(str(directory), f"node{i}")
            os.makedirs(node_dir, exist_ok=True)
            self.nodes.append(
                RedisServer(
                    node_dir,
                    port=ports_left.pop(),
                    options=(
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-port",
                        str(ports_left.pop()),
                        "--cluster-node-timeout",
                        str(self.NODE_TIMEOUT_MS),
                        "--appendonly",
                        "no",
                        # A replica syncs at once (not 5 s later): one never synced cannot fail over.
                        "--repl-diskless-sync-delay",
                        "0",
                        # The other primaries' slots keep serving while one primary's are down (the
                        # default refuses every key until a replica has taken over: CLUSTERDOWN).
                        "--cluster-require-full-coverage",
                        "no",
                    ),
                )
            )

    @property
    def url(self) -> str:
        """`redis-cluster://host:port,host:port,...`: every node is a startup node."""
        return "redis-cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def start(self) -> RedisClusterServers:
        for node in self.nodes:
            node.start()
        created = subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{node.port}" for node in self.nodes),
                "--cluster-replicas",
                "1",
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if created.returncode != 0:
            self.kill()
            pytest.fail(f"redis-cli --cluster create failed:\n{created.stdout}\n{created.stderr}", pytrace=False)
        self.wait_until_ok()
        return self

    def wait_until_ok(self, timeout: float = 30.0) -> None:
        """Until every running node says cluster_state:ok and knows a primary for every slot,
        and every replica is in sync with its primary (so that it could take over)."""
        deadline = time.monotonic() + timeout
        while True:
            states = []
            for node in self.running():
                client = node.client(socket_timeout=1.0, socket_connect_timeout=1.0)
                try:
                    info = client.execute_command("CLUSTER", "INFO")
                    replication = client.info("replication")
                    states.append(
                        b"cluster_state:ok" in info
                        and b"cluster_slots_ok:16384" in info
                        and (replication["role"] == "master" or replication.get("master_link_status") == "up")
                    )
                except redis.RedisError:
                    states.append(False)
                finally:
                    client.close()
            if all(states):
                return
            if time.monotonic() > deadline:
                pytest.fail(f"the cluster did not come up within {timeout} s", pytrace=False)
            time.sleep(0.05)  # waiting for the cluster's gossip, not an edge

    def running(self) -> list:
        return [node for node in self.nodes if node.process is not None]

    def primaries(self) -> list:
        """The running nodes that are primaries now (roles change after a failover)."""
        found = []
        for node in self.running():
            client = node.client(socket_timeout=1.0)
            try:
                if client.execute_command("ROLE")[0] == b"master":
                    found.append(node)
            finally:
                client.close()
        return found

    def flushall(self) -> None:
        for node in self.primaries():
            client = node.client()
            try:
                client.flushall()
                client.script_flush()
            finally:
                client.close()

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()


@pytest.fixture(scope="session")
def redis_cluster_servers(tmp_path_factory):
    """The session's Redis Cluster (3 primaries, 3 replicas), started on first use."""
    cluster = RedisClusterServers(tmp_path_factory.mktemp("cluster")).start()
    yield cluster
    cluster.kill()


@pytest.fixture
def redis_cluster_url(redis_cluster_servers):
    """The session cluster's URL, every primary emptied of keys and scripts first."""
    redis_cluster_servers.flushall()
    return redis_cluster_servers.url


@pytest.fixture
def disposable_redis_cluster(tmp_path):
    """A cluster of this test's own, which it may break (kill a primary, fail over)."""
    cluster = RedisClusterServers(tmp_path).start()
    yield cluster
    cluster.kill()


@pytest.fixture(autouse=True)
def fresh_login_limit():
    """Each test's admin logins count from zero (limiter_admin/login_limit.py keeps its
    in-process buckets in a store of its own, made anew here)."""
    from django.conf import settings

    if settings.configured:
        from limiter_admin.login_limit import login_limiter

        login_limiter.cache_clear()
    yield
