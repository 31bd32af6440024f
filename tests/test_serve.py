"""bin/serve, as `make run` runs it: with Redis, the gateways' own pool of workers apart from
the console's, which runs at a lower CPU priority; Ctrl-C stops both at once."""

import http.client
import json
import os
import signal
import subprocess
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


@pytest.fixture
def prepared(redis_url):
    """A migrated database with a policy and a token, as `make run` leaves it before serving."""
    service = Service(POLICY, redis_url=redis_url)
    path = os.path.join(service.directory.name, "policy.json")
    with open(path, "w") as out:
        json.dump(POLICY, out)
    service.manage("migrate", "--noinput")
    service.manage("loadpolicies", path)
    service.token = service.manage("createservicetoken", "gateway").strip().splitlines()[-1]
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
