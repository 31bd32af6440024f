"""Issue 26: a body sent in chunks (`Transfer-Encoding: chunked`, no Content-Length) was read as
empty, "keys: this field is required". It is read now (limiter_admin/chunked.py), within the
same 2.5 MB as any body: first the wrapper itself, on plain WSGI calls; then the real thing,
chunked requests on a socket to gunicorn, as `make run` serves."""

import io
import json
from collections.abc import Iterator

import pytest

from limiter_admin.chunked import ChunkedBodies
from tests.serving import Service

# Served on a database of their own (tests/serving.py), or none: PostgreSQL's pass would
# repeat them.
pytestmark = pytest.mark.sqlite

# --- the wrapper, on WSGI calls ------------------------------------------------------------------


class Recorder:
    """A WSGI application that keeps what it was called with, and the body it could read."""

    def __init__(self) -> None:
        self.environ: dict | None = None
        self.body = b""

    def __call__(self, environ, start_response):
        self.environ = environ
        self.body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        start_response("200 OK", [])
        return [b""]


def call(app, environ: dict) -> tuple[str, bytes]:
    said = []
    body = b"".join(app(environ, lambda status, headers: said.append(status)))
    return said[0], body


def chunked_environ(body: bytes, terminated: bool = True) -> dict:
    """A chunked POST as a server hands it on: the body taken out of its chunks, no length."""
    return {
        "REQUEST_METHOD": "POST",
        "HTTP_TRANSFER_ENCODING": "chunked",
        "CONTENT_TYPE": "application/json",
        "wsgi.input": io.BytesIO(body),
        "wsgi.input_terminated": terminated,
    }


def test_a_chunked_body_on_a_terminated_input_is_handed_on_with_its_length():
    inner = Recorder()
    assert call(ChunkedBodies(inner), chunked_environ(b'{"keys": {"team": "acme"}}'))[0] == "200 OK"
    assert inner.body == b'{"keys": {"team": "acme"}}'
    assert inner.environ["CONTENT_LENGTH"] == "26"


def test_a_body_with_a_content_length_is_handed_on_untouched():
    inner, stream = Recorder(), io.BytesIO(b"{}")
    environ = {"REQUEST_METHOD": "POST", "CONTENT_LENGTH": "2", "wsgi.input": stream, "wsgi.input_terminated": True}
    call(ChunkedBodies(inner), dict(environ))
    assert inner.environ == environ and inner.environ["wsgi.input"] is stream


def test_a_chunked_body_is_read_one_byte_past_the_limit_for_django_to_refuse(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10
    inner, environ = Recorder(), chunked_environ(b"x" * 1000)
    stream = environ["wsgi.input"]
    call(ChunkedBodies(inner), environ)
    assert inner.environ["CONTENT_LENGTH"] == "11"  # > the limit: RequestDataTooBig when read
    assert stream.tell() == 11  # and no further


def test_a_chunked_body_on_an_input_that_may_go_on_is_a_411_and_never_read():
    inner, environ = Recorder(), chunked_environ(b"{}", terminated=False)
    status, body = call(ChunkedBodies(inner), environ)
    assert status == "411 Length Required" and inner.environ is None
    assert json.loads(body)["error"]["code"] == "length_required"
    assert environ["wsgi.input"].tell() == 0


# --- gunicorn ----------------------------------------------------------------------------------
# These also pin what the wrapper counts on: gunicorn takes the chunks apart and sets
# wsgi.input_terminated (were it to stop, each of these would be a 411).

POLICY = {
    "default_tier": "t",
    "levels": [{"name": "user"}, {"name": "team"}],
    "tiers": {
        "t": {
            "user": [{"type": "concurrency", "limit": 5, "lease": 60}],
            "team": [{"type": "token_bucket", "capacity": 50, "per_second": 0}],
        }
    },
}
ACME = {"user": "u1", "team": "acme"}


@pytest.fixture(scope="module")
def service():
    with Service(POLICY, scope="admin") as service:
        yield service


def chunks(body: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


def send_chunked(service, path: str, body: bytes, size: int = 7, content_type: str = "application/json"):
    """POST `body` in chunks of `size` bytes with no Content-Length, as http.client sends an
    iterable (`encode_chunked`): the status and the JSON answer."""
    connection = service.connection()
    try:
        headers = {"Authorization": f"Bearer {service.token}", "Content-Type": content_type}
        connection.request("POST", path, chunks(body, size), headers, encode_chunked=True)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


@pytest.mark.slow
def test_a_chunked_decision_is_decided_for_the_keys_it_sends(service):
    status, answer = send_chunked(service, "/api/v1/decisions", json.dumps({"keys": ACME, "cost": 2}).encode())
    assert status == 200, answer
    assert answer["allowed"] is True and answer["lease"]


@pytest.mark.slow
def test_a_chunked_batch_is_decided_request_by_request(service):
    batch = {"requests": [{"keys": ACME}, {"keys": {"team": "acme"}, "cost": 100}]}
    status, answer = send_chunked(service, "/api/v1/decisions/batch", json.dumps(batch).encode(), size=1)
    assert status == 200, answer
    assert [d["allowed"] for d in answer["decisions"]] == [True, False]


@pytest.mark.slow
def test_a_chunked_rls_request_is_answered(service):
    request = {"domain": "limiter", "descriptors": [{"entries": [{"key": "team", "value": "acme"}]}]}
    status, answer = send_chunked(service, "/api/v1/rls/json", json.dumps(request).encode())
    assert status == 200, answer
    assert answer["overallCode"] == "OK"


@pytest.mark.slow
def test_a_chunked_lease_release_reads_its_body(service):
    lease = service.post("/api/v1/decisions", {"keys": ACME})[1]["lease"]
    status, answer = send_chunked(service, f"/api/v1/leases/{lease}/release", b'{"actual_cost": 1}')
    assert status == 400 and list(answer["error"]["fields"]) == ["actual_cost"]  # read, and refused
    status, answer = send_chunked(service, f"/api/v1/leases/{lease}/release", b"{}")
    assert status == 200 and answer["status"] == "released"


@pytest.mark.slow
def test_a_chunked_policy_write_is_saved_whole(service):
    tenant = {
        "key": "chunky",
        "tier": "t",
        "overrides": {"team": [{"type": "token_bucket", "capacity": 9, "per_second": 1}]},
    }
    status, answer = send_chunked(service, "/api/v1/tenants", json.dumps(tenant).encode())
    assert status == 201, answer
    assert service.get("/api/v1/tenants/chunky") == (200, {**tenant, "overrides_until": None, "version": 1})


@pytest.mark.slow
def test_a_chunked_body_larger_than_the_limit_is_refused_and_saves_nothing(service):
    before = service.get("/api/v1/tenants")[1]["count"]
    # Just past 2.5 MB, so that what the server leaves unread fits in the sockets' buffers.
    tenant = {"key": "k" * 2_621_440, "tier": "t"}
    status, answer = send_chunked(service, "/api/v1/tenants", json.dumps(tenant).encode(), size=64 * 1024)
    assert status == 400
    assert answer["error"] == {
        "code": "malformed_request",
        "message": "the body is larger than the 2621440 bytes allowed",
        "fields": {},
    }
    assert service.get("/api/v1/tenants")[1]["count"] == before


@pytest.mark.slow
def test_a_chunked_body_is_held_to_the_json_content_type(service):
    status, answer = send_chunked(
        service, "/api/v1/decisions", b'{"keys": {"team": "acme"}}', content_type="text/plain"
    )
    assert status == 415 and answer["error"]["code"] == "unsupported_media_type"
