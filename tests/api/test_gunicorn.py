"""End to end: gunicorn with 4 workers sharing a real Redis; exactness across processes."""

import json
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

# Served on a database of their own (tests/serving.py): PostgreSQL's pass would repeat them.
pytestmark = [pytest.mark.slow, pytest.mark.sqlite]

POLICY = {
    "default_tier": "t",
    "levels": [{"name": "user"}, {"name": "team", "fail_mode": "closed"}],
    "tiers": {"t": {"team": [{"type": "token_bucket", "capacity": 50, "per_second": 0}]}},
}


def test_200_concurrent_requests_at_a_team_of_50_admit_exactly_50(redis_url):
    from tests.serving import Service

    # A patient store: on a busy host (CI's two cores, 4 workers, 50 client threads) a reply
    # may take longer than the 50 ms default, and a degraded answer is not what this counts
    # (tests/reliability measures the timeouts).
    with Service(POLICY, redis_url=redis_url, workers=4, extra_env={"LIMITER_STORE_TIMEOUT": "1.0"}) as service:
        assert len(service.worker_pids()) == 4

        def one(i):
            return service.post("/api/v1/decisions", {"keys": {"user": f"u{i}", "team": "acme"}})

        with ThreadPoolExecutor(max_workers=50) as pool:
            answers = list(pool.map(one, range(200)))
    statuses = {status for status, _ in answers}
    assert statuses == {200}
    allowed = [body for _, body in answers if body["allowed"]]
    denied = [body for _, body in answers if not body["allowed"]]
    assert len(allowed) == 50
    assert len(denied) == 150
    assert all(body["degraded"] is False for _, body in answers)
    assert {body["blocked_by"] for body in denied} == {"team: token_bucket(50, 0/s)"}


SLOTS = 100
SLOT_POLICY = {
    "default_tier": "t",
    "levels": [{"name": "team", "fail_mode": "closed"}],
    "tiers": {"t": {"team": [{"type": "concurrency", "limit": SLOTS, "lease": 600}]}},
}


def test_workers_forked_from_one_parent_hand_out_leases_of_their_own(redis_url):
    """Issue 26: under `gunicorn --preload` both workers drew their lease ids from one parent's
    prefix and counter, so two requests in flight shared one slot and one release freed the
    other's. Each forked worker draws its own now."""
    from tests.serving import Service

    extra = {"GUNICORN_CMD_ARGS": "--preload", "LIMITER_STORE_TIMEOUT": "1.0"}
    taken = 40
    with Service(SLOT_POLICY, redis_url=redis_url, workers=2, extra_env=extra) as service:
        assert len(service.worker_pids()) == 2

        def one(_):
            return service.post("/api/v1/decisions", {"keys": {"team": "acme"}})

        # A connection each: gunicorn's two workers both take a share of them.
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(one, range(taken)))
        assert {status for status, _ in answers} == {200}
        tickets = [body["lease"] for _, body in answers]
        leases = [ticket.split(".")[0] for ticket in tickets]
        assert len(set(leases)) == taken, "two requests in flight were given one lease"
        assert len({lease.rsplit("-", 1)[0] for lease in leases}) == 2, "both workers answered, each its own prefix"

        def room() -> float:
            status, body = service.post("/api/v1/decisions", {"keys": {"team": "acme"}, "dry_run": True})
            assert status == 200
            return body["remaining"]

        assert room() == SLOTS - taken  # every request in flight holds a slot of its own
        status, body = service.post(f"/api/v1/leases/{tickets[0]}/release", None)
        assert status == 200 and body["released"] == 1
        assert room() == SLOTS - taken + 1  # one release frees one slot, not another's


QUOTA = 200
QUOTA_POLICY = {
    "default_tier": "t",
    "levels": [{"name": "team", "fail_mode": "closed"}],
    "tiers": {"t": {"team": [{"type": "quota", "limit": QUOTA, "period": "none"}]}},
}


def test_four_workers_spend_a_quota_exactly_with_reservations_settled_above_and_below(redis_url):
    """Issue 21: 4 workers, 120 reservations of 4 at once against 200 credits: 50 fit. Each is
    settled at 1, 3 or 7.5 (below and above its estimate); then plain decisions of 1 spend
    what is left. In all exactly the limit is spent, or the overspend that settlements above
    the estimate left shows, and nothing is taken past it."""
    from tests.serving import Service

    extra = {"LIMITER_STORE_TIMEOUT": "1.0"}
    keys = {"team": "acme"}
    with Service(QUOTA_POLICY, redis_url=redis_url, workers=4, extra_env=extra) as service:
        assert len(service.worker_pids()) == 4

        def reserve_and_settle(i):
            status, body = service.post("/api/v1/reservations", {"keys": keys, "cost": 4})
            if not body["allowed"]:
                return status, 0.0
            actual = (1.0, 3.0, 7.5)[i % 3]
            settled, _ = service.post(f"/api/v1/reservations/{body['id']}/commit", {"actual_cost": actual})
            assert settled == 200
            return status, actual

        with ThreadPoolExecutor(max_workers=24) as pool:
            answers = list(pool.map(reserve_and_settle, range(120)))
        assert {status for status, _ in answers} <= {200, 201}
        charged = sum(actual for _, actual in answers)
        reserved = sum(1 for status, _ in answers if status == 201)

        def spend(_):
            status, body = service.post("/api/v1/decisions", {"keys": keys})
            assert status == 200 and body["degraded"] is False
            return body["allowed"]

        with ThreadPoolExecutor(max_workers=24) as pool:
            spent = sum(pool.map(spend, range(QUOTA)))
        status, body = service.post("/api/v1/decisions", {"keys": keys, "dry_run": True})
    assert reserved >= QUOTA // 4  # at least the first 50 fit (settlements below free room for more)
    assert status == 200 and body["allowed"] is False
    left = QUOTA - charged - spent
    assert body["remaining"] == pytest.approx(max(left, 0.0))  # what the workers charged, exactly
    if charged >= QUOTA:
        assert spent == 0  # the overspend shows: nothing more is allowed
    else:  # every unit spent once: a spend of 1 no longer fits in what is left
        assert 0 <= left < 1, (charged, spent)


# --- what gunicorn, as `make run` serves (DEBUG=1), answers to a body or a header too large ----------

TEAM_POLICY = {
    "default_tier": "t",
    "levels": [{"name": "team"}],
    "tiers": {"t": {"team": [{"type": "token_bucket", "capacity": 50, "per_second": 0}]}},
}
MB3 = 3 * 1024 * 1024


@pytest.fixture(scope="module")
def debug_service():
    from tests.serving import Service

    with Service(TEAM_POLICY, extra_env={"DEBUG": "1"}, scope="admin") as service:
        yield service


class Raw:
    """One keep-alive connection spoken to byte by byte, so that a test sees the Connection
    field and whether the server really keeps the connection open afterwards."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buffer = b""

    def send(self, head: str, body: bytes = b"") -> None:
        self.sock.sendall(head.encode("latin-1") + b"\r\n")
        try:
            self.sock.sendall(body)
        except OSError:
            pass  # the server answered and closed before the whole body went: read its answer

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            self._more()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            self._more()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(lines[0].split()[1]), headers, body

    def closed_by_server(self) -> bool:
        """True when the server has closed its side (end of stream, or a reset)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def _more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection before answering")
        self.buffer += data

    def close(self) -> None:
        self.sock.close()


def post_head(service, path: str, length: int) -> str:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {service.token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n"
    )


@pytest.mark.parametrize("path", ["/api/v1/decisions", "/api/v1/tenants"])
def test_under_debug_a_body_too_large_is_the_apis_json_and_the_connection_says_close(debug_service, path):
    """Issue 25: a 3 MB body got Django's 94 KB HTML debug page under DEBUG=1, and an answer that
    said "Connection: keep-alive" on a connection gunicorn then dropped."""
    body = b'{"keys": {"team": "' + b"a" * MB3 + b'"}}'
    raw = Raw(debug_service.port)
    try:
        raw.send(post_head(debug_service, path, len(body)), body)
        status, headers, content = raw.answer()
        assert status == 400 and headers["content-type"] == "application/json", content[:200]
        assert json.loads(content)["error"] == {
            "code": "malformed_request",
            "message": "the body is larger than the 2621440 bytes allowed",
            "fields": {},
        }
        assert headers["connection"] == "close"
        assert raw.closed_by_server()
    finally:
        raw.close()


def test_a_body_within_the_limit_keeps_the_connection_alive(debug_service):
    body = json.dumps({"keys": {"team": "kept"}}).encode()
    raw = Raw(debug_service.port)
    try:
        for _ in range(2):  # the second request on the same connection is answered too
            raw.send(post_head(debug_service, "/api/v1/decisions", len(body)), body)
            status, headers, content = raw.answer()
            assert status == 200 and json.loads(content)["allowed"] is True
            assert headers["connection"] == "keep-alive"
    finally:
        raw.close()


def test_a_header_too_large_is_gunicorns_own_431_page_as_docs_api_says(debug_service):
    """gunicorn refuses a header field over 8,190 bytes before the application sees it, with a
    short HTML page, and has no hook to answer otherwise: docs/API.md says so."""
    raw = Raw(debug_service.port)
    try:
        raw.send(f"GET /api/v1/tiers HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: {'b' * 10_000}\r\n")
        status, headers, content = raw.answer()
        assert status == 431 and headers["content-type"] == "text/html"
        assert b"Request Header Fields Too Large" in content
        assert headers["connection"] == "close" and raw.closed_by_server()
    finally:
        raw.close()
    api = Path(__file__).resolve().parents[2].joinpath("docs", "API.md").read_text()
    assert "431" in api and "limit_request_field_size" in api
