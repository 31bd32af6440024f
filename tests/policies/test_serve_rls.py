"""`manage.py serve_rls`, and gunicorn serving gRPC beside the REST API as `make run` does
(RLS_BIND): one store for both, the in-process one included; one Ctrl-C stops both."""

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time

import grpc
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from tests.policies.conftest import POLICY
from tests.polling import until
from tests.serving import ROOT, Service, free_port

# Served on a database of their own (tests/serving.py), or none: PostgreSQL's pass would
# repeat them.
pytestmark = pytest.mark.sqlite

Response = rls_pb2.RateLimitResponse


def team_policy(limit: int) -> dict:
    policy = copy.deepcopy(POLICY)
    policy["tiers"]["free"]["team"] = [{"type": "fixed_window", "limit": limit, "window": 3600}]
    return policy


def should_rate_limit(port: int, token: str, team: str = "t1", hits: int = 0):
    """One call, with the service token in its metadata ("" for none)."""
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="team", value=team)
    request = rls_pb2.RateLimitRequest(
        domain="limiter", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])], hits_addend=hits
    )
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        return stub.ShouldRateLimit(request, metadata=metadata, timeout=10, wait_for_ready=True)


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
        return True
    except OSError:
        return False


def test_gunicorn_serves_grpc_and_rest_from_one_in_process_store_and_one_ctrl_c_stops_both():
    rls = free_port()
    with Service(team_policy(6), extra_env={"RLS_BIND": f"127.0.0.1:{rls}"}) as service:
        assert should_rate_limit(rls, service.token, hits=3).overall_code == Response.OK
        status, body = service.post("/api/v1/decisions", {"keys": {"team": "t1"}, "cost": 2})
        assert status == 200 and body["allowed"] and body["remaining"] == 1
        assert should_rate_limit(rls, service.token).overall_code == Response.OK
        assert should_rate_limit(rls, service.token).overall_code == Response.OVER_LIMIT
        status, body = service.post("/api/v1/decisions", {"keys": {"team": "t1"}})
        assert status == 200 and not body["allowed"]
        # Ctrl-C in a terminal: SIGINT to the whole process group.
        os.killpg(service.process.pid, signal.SIGINT)
        assert service.process.wait(15) == 0
        assert not listening(rls) and not listening(service.port)


def test_the_gateways_granian_pool_serves_grpc_from_every_worker_beside_rest(redis_url):
    """bin/serve's gateways' pool (limiter_admin/gateway_wsgi.py under granian): each worker
    serves gRPC on RLS_BIND beside the REST API, on the one Redis store, and stops it."""
    rls = free_port()
    extra = {"RLS_BIND": f"127.0.0.1:{rls}", "LIMITER_STORE_TIMEOUT": "1.0"}
    app = "limiter_admin.gateway_wsgi:application"
    with Service(
        team_policy(40), redis_url=redis_url, workers=2, extra_env=extra, server="granian", app=app
    ) as service:
        workers = service.worker_pids()
        assert len(workers) == 2
        # The service answers once one worker does; the other may still be starting its server.
        until(lambda: all(_listens(pid, rls) for pid in workers), 30)
        serving = [pid for pid in workers if _listens(pid, rls)]
        assert sorted(serving) == sorted(workers), "a worker does not serve gRPC"
        assert should_rate_limit(rls, service.token, hits=30).overall_code == Response.OK
        status, body = service.post("/api/v1/decisions", {"keys": {"team": "t1"}, "cost": 8})
        assert status == 200 and body["allowed"] and body["remaining"] == 2
        assert should_rate_limit(rls, service.token, hits=3).overall_code == Response.OVER_LIMIT
        assert should_rate_limit(rls, service.token, hits=2).overall_code == Response.OK
        # As bin/serve stops it: one SIGINT to granian's main process, which stops its workers.
        os.kill(service.process.pid, signal.SIGINT)
        assert service.process.wait(15) == 0
        assert not listening(rls) and not listening(service.port)


def _listens(pid: int, port: int) -> bool:
    """Whether process `pid` holds a socket listening on `port` (its own, SO_REUSEPORT)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port and fields[9] in inodes:
                    return True
    return False


def test_an_empty_rls_bind_serves_no_grpc():
    rls = free_port()
    with Service(team_policy(6), extra_env={"RLS_BIND": ""}) as service:
        assert service.get("/healthz")[0] == 200
        assert not listening(rls)


def test_by_default_a_call_without_a_token_spends_nothing():
    """The finding of issue 26: unauthenticated calls took a tenant's concurrency slots."""
    rls = free_port()
    service = Service(team_policy(2), extra_env={"RLS_BIND": f"127.0.0.1:{rls}"})
    service.env.pop("LIMITER_RLS_REQUIRE_TOKEN", None)  # unset: the default
    with service:
        for token in ("", "la_made_up_token"):
            with pytest.raises(grpc.RpcError) as refused:
                should_rate_limit(rls, token)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # Nothing was spent: the tenant's two decisions are still there, for a caller with a token.
        codes = [should_rate_limit(rls, service.token).overall_code for _ in range(3)]
        assert codes == [Response.OK, Response.OK, Response.OVER_LIMIT]


@pytest.fixture
def database():
    """A migrated database with the policy loaded, for a manage.py of its own, and a token."""
    service = Service(team_policy(2))
    service.manage("migrate", "--noinput")
    path = os.path.join(service.directory.name, "policy.json")
    with open(path, "w") as out:
        json.dump(service.policy, out)
    service.manage("loadpolicies", path)
    service.token = service.manage("createservicetoken", "envoy").strip().splitlines()[-1]
    yield service
    service.directory.cleanup()


@pytest.mark.parametrize("bind", ["0.0.0.0:0", "[::]:0", "10.1.2.3:8081", "limiter.example:8081"])
def test_serve_rls_without_a_token_refuses_an_address_beyond_loopback(database, bind):
    done = subprocess.run(
        [sys.executable, "manage.py", "serve_rls", "--bind", bind],
        cwd=ROOT,
        env={**database.env, "LIMITER_RLS_REQUIRE_TOKEN": "0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert f"refusing to serve Envoy's rate limit service on {bind!r} without a token" in done.stderr


def test_serve_rls_without_a_token_serves_loopback(database):
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "manage.py", "serve_rls", "--bind", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env={**database.env, "LIMITER_RLS_REQUIRE_TOKEN": "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline().strip() == f"Envoy's rate limit service (gRPC) on 127.0.0.1:{port}"
        assert should_rate_limit(port, "").overall_code == Response.OK
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(15)


def test_serve_rls_serves_until_interrupted(database):
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "manage.py", "serve_rls", "--bind", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=database.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline().strip() == f"Envoy's rate limit service (gRPC) on 127.0.0.1:{port}"
        codes = [should_rate_limit(port, database.token).overall_code for _ in range(3)]
        assert codes == [Response.OK, Response.OK, Response.OVER_LIMIT]
        process.send_signal(signal.SIGINT)
        assert process.wait(15) == 0
        assert "this process counts alone" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_serve_rls_on_a_taken_port_exits_non_zero_naming_it(database):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "manage.py", "serve_rls", "--bind", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=database.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode != 0
    assert f"cannot serve Envoy's rate limit service on '127.0.0.1:{port}'" in done.stderr


def test_a_reload_keeps_grpc_served_by_the_new_worker():
    rls = free_port()
    with Service(team_policy(100), extra_env={"RLS_BIND": f"127.0.0.1:{rls}"}) as service:
        assert should_rate_limit(rls, service.token).overall_code == Response.OK
        [old] = service.worker_pids()
        # SIGHUP: gunicorn replaces its worker; the new one serves gRPC on the same port.
        os.kill(service.process.pid, signal.SIGHUP)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (old in service.worker_pids() or not service.worker_pids()):
            time.sleep(0.05)  # waiting for gunicorn's reload, not an edge under test
        assert old not in service.worker_pids() and len(service.worker_pids()) == 1
        assert should_rate_limit(rls, service.token).overall_code == Response.OK
        assert "Worker failed to boot" not in service.read_log()


@pytest.mark.parametrize("environment, passed", [({}, "RLS_BIND='127.0.0.1:8081'"), ({"RLS_BIND": ""}, "RLS_BIND=''")])
def test_make_run_hands_gunicorn_rls_bind_by_default_and_empty_when_told(environment, passed):
    env = {k: v for k, v in os.environ.items() if k != "RLS_BIND"} | environment
    done = subprocess.run(["make", "-n", "run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    [line] = [line for line in done.stdout.splitlines() if "bin/serve" in line]
    assert f" {passed} " in f" {line} "
