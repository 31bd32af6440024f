"""bin/serve, as `make run` runs it: with Redis, the gateways' own pool of workers apart from
the console's, which runs at a lower CPU priority; Ctrl-C stops both at once."""

import http.client
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.policies.conftest import POLICY
from tests.serving import ROOT, STARTUP_TIMEOUT, Service, free_port

pytestmark = pytest.mark.slow


def ask(port: int, method: str, path: str, body: dict | None = None, token: str = "") -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        connection.request(method, path, json.dumps(body) if body is not None else None, headers)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def answering(port: int) -> bool:
    try:
        return ask(port, "GET", "/healthz") == 200
    except OSError:
        return False


def niceness(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(child) for child in found]


def prepare(redis_url: str | None) -> Service:
    """A migrated database with a policy and a token, as `make run` leaves it before serving."""
    service = Service(POLICY, redis_url=redis_url)
    path = os.path.join(service.directory.name, "policy.json")
    with open(path, "w") as out:
        json.dump(POLICY, out)
    service.manage("migrate", "--noinput")
    service.manage("loadpolicies", path)
    service.token = service.manage("createservicetoken", "gateway").strip().splitlines()[-1]
    return service


@pytest.fixture
def prepared(redis_url):
    service = prepare(redis_url)
    yield service
    service.directory.cleanup()


@pytest.fixture
def prepared_in_process():
    """As `make run` leaves it without REDIS_URL: one pool of one worker."""
    service = prepare(None)
    yield service
    service.directory.cleanup()


def test_with_redis_the_gateways_have_a_pool_of_their_own_and_ctrl_c_stops_both(prepared):
    port, gateways = free_port(), free_port()
    env = {**prepared.env, "PORT": str(port), "GATEWAY_BIND": f"127.0.0.1:{gateways}", "RLS_BIND": "", "WORKERS": "2"}
    env["BIN"] = str(Path(os.sys.executable).parent)
    serve = subprocess.Popen(
        ["bin/serve"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not (answering(port) and answering(gateways)) and time.monotonic() < deadline:
            time.sleep(0.05)  # start-up polling, not an edge under test
        assert answering(port) and answering(gateways)
        decision = {"keys": {"team": "acme", "user": "u1"}}
        assert ask(gateways, "POST", "/api/v1/decisions", decision, prepared.token) == 200
        assert ask(port, "POST", "/api/v1/decisions", decision, prepared.token) == 200  # the console's pool too
        assert ask(port, "GET", "/admin/login/") == 200
        assert ask(gateways, "GET", "/admin/login/") == 404  # the gateways' pool serves no console
        assert ask(gateways, "GET", "/api/v1/tiers", token=prepared.token) == 404
        masters = children(serve.pid)
        assert len(masters) == 2
        nice = sorted(niceness(worker) for master in masters for worker in children(master))
        assert nice == [0, 0, 10, 10]  # two gateway workers at 0, the console's two at 10
        os.killpg(serve.pid, signal.SIGINT)  # Ctrl-C in a terminal
        started = time.monotonic()
        assert serve.wait(15) == 0
        assert time.monotonic() - started < 5
        assert not answering(port) and not answering(gateways)
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait()


def test_without_redis_one_pool_serves_everything(prepared):
    env = {k: v for k, v in prepared.env.items() if k != "REDIS_URL"}
    done = subprocess.run(
        ["make", "-n", "run"], cwd=ROOT, env=env | {"GATEWAY_BIND": ""}, capture_output=True, text=True, timeout=60
    )
    [line] = [line for line in done.stdout.splitlines() if "bin/serve" in line]
    assert "GATEWAY_BIND=''" in line and "WORKERS='1'" in line


class PacedGateway(threading.Thread):
    """A gateway's keep-alive connection: a decision, a pause, the next one on the same
    connection, until told to stop or the server is gone. `answers`: the statuses."""

    def __init__(self, port: int, token: str, pause: float) -> None:
        super().__init__(daemon=True)
        self.port, self.token, self.pause = port, token, pause
        self.answers: list[int] = []
        self.connection_said = ""  # the last answer's Connection field: keep-alive or close
        self.failure: OSError | None = None  # how the next request failed, once the server stopped
        self.stopping = threading.Event()

    def run(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"}
        body = json.dumps({"keys": {"team": "acme", "user": "u1"}})
        try:
            while not self.stopping.is_set():
                connection.request("POST", "/api/v1/decisions", body, headers)
                response = connection.getresponse()
                response.read()
                self.answers.append(response.status)
                self.connection_said = response.getheader("Connection", "")
                self.stopping.wait(self.pause)  # the gateway's pace, not an edge under test
        except OSError as error:
            self.failure = error
        finally:
            connection.close()


def serve(service: Service, **env: str) -> tuple[subprocess.Popen, int]:
    """bin/serve on `service`'s database, in a session of its own (as a terminal runs it), once
    it answers on PORT."""
    port = free_port()
    environ = {**service.env, "PORT": str(port), "RLS_BIND": "", "BIN": str(Path(os.sys.executable).parent), **env}
    serving = subprocess.Popen(
        ["bin/serve"], cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not answering(port) and time.monotonic() < deadline:
        time.sleep(0.05)  # start-up polling, not an edge under test
    assert answering(port), "bin/serve did not answer"
    return serving, port


@pytest.mark.parametrize("pools", ["one pool, in-process store", "two pools, Redis"])
def test_ctrl_c_stops_within_a_second_while_gateways_hold_kept_alive_connections(pools, request):
    """Issue 25: Ctrl-C took 10 s and logged "Worker was sent SIGKILL! Perhaps out of memory?"
    while gateways held kept-alive connections: the worker's quick stop, handling the master's
    SIGQUIT inside the terminal's SIGINT, waited forever for a lock the first handler held."""
    if pools.startswith("one"):
        service, env = request.getfixturevalue("prepared_in_process"), {"GATEWAY_BIND": "", "WORKERS": "1"}
        gateway_port = None
    else:
        service, gateway_port = request.getfixturevalue("prepared"), free_port()
        env = {"GATEWAY_BIND": f"127.0.0.1:{gateway_port}", "WORKERS": "2", "CONSOLE_WORKERS": "1"}
    serving, port = serve(service, **env)
    ports = [port]
    if gateway_port is not None:  # the gateways' own pool (granian) holds connections too
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not answering(gateway_port) and time.monotonic() < deadline:
            time.sleep(0.05)  # start-up polling, not an edge under test
        ports.append(gateway_port)
    gateways = [PacedGateway(p, service.token, pause) for p in ports for pause in (0.2, 0.3, 0.5)]
    idle = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        for gateway in gateways:
            gateway.start()
        idle.request("GET", "/healthz")
        idle.getresponse().read()  # answered, and held open (keep-alive) without another request
        while not all(len(gateway.answers) >= 2 for gateway in gateways):
            time.sleep(0.05)  # until every gateway is under way on its connection
        os.killpg(serving.pid, signal.SIGINT)  # Ctrl-C in a terminal: every process of the session
        started = time.monotonic()
        status = serving.wait(15)
        took = time.monotonic() - started
        log = serving.stdout.read().decode()
        assert status == 0, log
        assert took < 2, f"stopping took {took:.1f} s:\n{log}"
        assert "SIGKILL" not in log and "[ERROR]" not in log and "refused to gracefully stop" not in log, log
        assert not any(answering(p) for p in ports)
    finally:
        for gateway in gateways:
            gateway.stopping.set()
        idle.close()
        if serving.poll() is None:
            os.killpg(serving.pid, signal.SIGKILL)
            serving.wait()
    for gateway in gateways:
        gateway.join(10)
        assert gateway.answers and set(gateway.answers) == {200}
        if gateway.port == gateway_port:
            # granian closes a kept-alive connection between two requests when it stops, without
            # a "Connection: close" first: the next request fails on the closed connection, and
            # the gateway retries once on a new one (docs/OPERATIONS.md).
            assert gateway.failure is None or isinstance(gateway.failure, ConnectionError), gateway.failure
            continue
        # A request failed only on a new connection, opened because the last answer said
        # "Connection: close" (refused, or reset from the backlog of a worker on its way out),
        # never on a connection the server had said it would keep.
        assert gateway.failure is None or gateway.connection_said == "close", (gateway.failure, gateway.answers)
