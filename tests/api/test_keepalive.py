"""End to end: a gateway keeps one connection open for its decisions (keep-alive), through
real gunicorn served as `make run` serves it (limiter_admin/gunicorn_conf.py, 4 workers of 8
threads on a real Redis), and through granian as bin/serve serves the gateways' own pool."""

import http.client
import json

import pytest

# Served on a database of their own (tests/serving.py): PostgreSQL's pass would repeat them.
pytestmark = [pytest.mark.slow, pytest.mark.sqlite]

POLICY = {
    "default_tier": "t",
    "levels": [{"name": "user"}, {"name": "team"}],
    "tiers": {"t": {"team": [{"type": "token_bucket", "capacity": 1000, "per_second": 100}]}},
}
DECISIONS = 200


# gunicorn as limiter_admin/gunicorn_conf.py configures it (the console's pool, and the one
# pool without Redis), and granian as bin/serve serves the gateways' own pool.
SERVERS = {
    "gunicorn": {},
    "granian": {"server": "granian", "app": "limiter_admin.gateway_wsgi:application"},
}


@pytest.mark.parametrize("server", SERVERS)
def test_200_decisions_are_answered_on_one_connection_that_the_server_never_closes(redis_url, server):
    from tests.serving import Service

    # A patient store, as tests/api/test_gunicorn.py: a slow reply on a busy host is not
    # what this counts.
    extra = {"LIMITER_STORE_TIMEOUT": "1.0"}
    with Service(POLICY, redis_url=redis_url, workers=4, extra_env=extra, **SERVERS[server]) as service:
        headers = {"Authorization": f"Bearer {service.token}", "Content-Type": "application/json"}
        connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
        connection.connect()
        sock, ours = connection.sock, connection.sock.getsockname()
        answers = []
        try:
            for i in range(DECISIONS):
                body = json.dumps({"keys": {"user": f"u{i}", "team": "acme"}})
                connection.request("POST", "/api/v1/decisions", body, headers)
                response = connection.getresponse()
                answers.append((response.status, response.getheader("Connection"), json.loads(response.read())))
                # http.client drops a socket the server said it would close, and opens a new
                # one for the next request: the same socket throughout means none was closed.
                assert connection.sock is sock, f"the server closed the connection after decision {i + 1}"
            assert connection.sock.getsockname() == ours
        finally:
            connection.close()
    assert [status for status, _, _ in answers] == [200] * DECISIONS
    assert {field for _, field, _ in answers} <= {None, "keep-alive"}  # never "close"
    assert all(body["allowed"] and not body["degraded"] for _, _, body in answers)
