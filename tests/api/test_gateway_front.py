"""The gateway front (limiter_admin/gateway_front.py) answers exactly as Django's handler does.

Each request is sent twice on a fresh in-process store and the same clock: once to Django's
WSGI handler alone, once through the front. The status line, every header field and the body
must be the same, and the front must have served the gateways' calls itself (Django's
handler not called) and handed everything else on.
"""

import io
import json
import re

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import DatabaseError, close_old_connections

from core.stores.memory import MemoryStore
from limiter_admin.gateway_front import LEFT_OUT, RUN, GatewayFront, direct_path
from policies.compile import PolicyCache, install_policy_cache
from policies.services import decisions

from .conftest import make_token

KEYS = {"user": "u1", "team": "acme", "global": "*"}


class Counting:
    """Django's WSGI handler, counting the requests it is handed."""

    def __init__(self) -> None:
        self.handler, self.calls = WSGIHandler(), 0

    def __call__(self, environ, start_response):
        self.calls += 1
        return self.handler(environ, start_response)


def environ(method, path, body=b"", token=None, **headers):
    env = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "localhost",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": io.StringIO(),
        "wsgi.url_scheme": "http",
        "wsgi.version": (1, 0),
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    if body:
        env.update(CONTENT_TYPE="application/json", CONTENT_LENGTH=str(len(body)))
    if token:
        env["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    env.update(headers)
    return env


# A lease's ticket: the worker's prefix, a counter of its own, the keys, a signature. The
# counter moves on between the two answers; everything else must be the same.
TICKET = re.compile(r"[0-9a-f]{12}-[0-9a-z]+(\.[A-Za-z0-9_-]+){2}")


def send(application, env):
    seen = []
    result = application(env, lambda status, headers, exc_info=None: seen.append((status, headers)))
    try:
        body = b"".join(result)
    finally:
        getattr(result, "close", lambda: None)()
    status, headers = seen[0]
    # Content-Length is right for each, and compared as the bodies are (tickets may differ in length).
    assert dict(headers).get("Content-Length", str(len(body))) == str(len(body))
    headers = sorted((name, TICKET.sub("<ticket>", value)) for name, value in headers if name != "Content-Length")
    return status, headers, TICKET.sub("<ticket>", body.decode()).encode()


@pytest.fixture
def tokens(memory_engine, load, policy_doc):
    policy_doc["tiers"]["pro"]["team"].append({"type": "concurrency", "limit": 5, "lease": 60})
    load(policy_doc)
    return {"decide": make_token("decide"), "admin": make_token("admin", "ops")}


@pytest.fixture
def afresh(clock):
    """A fresh in-process store on the same clock: the second answer starts where the first did."""

    def afresh():
        install_policy_cache(PolicyCache(store=MemoryStore(), clock=clock, limiter_clock=clock))

    yield afresh
    install_policy_cache(None)


@pytest.fixture
def both(tokens, afresh, settings):
    """`both(env)`: (Django's answer, the front's answer, whether the front served it)."""
    settings.ALLOWED_HOSTS = ["localhost"]
    # As Django's test client does: the test's own database connection stays open.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    django = Counting()
    front = GatewayFront(django)

    def both(make_env):
        afresh()
        plain = send(django, make_env())
        afresh()
        before = django.calls
        fronted = send(front, make_env())
        return plain, fronted, django.calls == before

    yield both
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def post(path, data, token, **headers):
    body = data if isinstance(data, bytes) else json.dumps(data).encode()
    return lambda: environ("POST", path, body, token, **headers)


SERVED = {
    "an allowed decision": lambda t: post("/api/v1/decisions", {"keys": KEYS}, t["decide"]),
    "a decision holding a slot": lambda t: post("/api/v1/decisions", {"keys": KEYS, "cost": 2}, t["decide"]),
    "a cost that never fits": lambda t: post("/api/v1/decisions", {"keys": KEYS, "cost": 10**9}, t["decide"]),
    "a dry run": lambda t: post("/api/v1/decisions", {"keys": KEYS, "dry_run": True}, t["decide"]),
    "a batch": lambda t: post("/api/v1/decisions/batch", {"requests": [{"keys": KEYS}] * 3}, t["decide"]),
    "an admin token": lambda t: post("/api/v1/decisions", {"keys": KEYS}, t["admin"]),
    "bad JSON": lambda t: post("/api/v1/decisions", b"{nope", t["decide"]),
    "no keys": lambda t: post("/api/v1/decisions", {"cost": 1}, t["decide"]),
    "an unknown field": lambda t: post("/api/v1/decisions", {"keys": KEYS, "extra": 1}, t["decide"]),
    "a bad token": lambda t: post("/api/v1/decisions", {"keys": KEYS}, "la_0000_nope"),
    "no credentials": lambda t: post("/api/v1/decisions", {"keys": KEYS}, None),
    "a GET": lambda t: lambda: environ("GET", "/api/v1/decisions", token=t["decide"]),
    "a preflight": lambda t: lambda: environ("OPTIONS", "/api/v1/decisions/batch", token=t["decide"]),
    "HTML only": lambda t: post("/api/v1/decisions", {"keys": KEYS}, t["decide"], HTTP_ACCEPT="text/html"),
    "not JSON": lambda t: (
        lambda: {
            **environ("POST", "/api/v1/decisions", b"keys=1", t["decide"]),
            "CONTENT_TYPE": "text/plain",
        }
    ),
    "forward-auth": lambda t: (
        lambda: environ(
            "GET", "/api/v1/authz/some/path", token=t["decide"], HTTP_X_LIMITER_USER="u1", HTTP_X_LIMITER_TEAM="acme"
        )
    ),
    "envoy's JSON": lambda t: post(
        "/api/v1/rls/json",
        {"domain": "limiter", "descriptors": [{"entries": [{"key": "team", "value": "acme"}]}]},
        t["decide"],
    ),
    "an unknown lease": lambda t: post("/api/v1/leases/no-such-lease/release", b"", t["decide"]),
}
HANDED_ON = {
    "a console page": lambda t: lambda: environ("GET", "/admin/login/"),
    "a reservation (a DRF view)": lambda t: post("/api/v1/reservations", {"keys": KEYS, "cost": 1}, t["decide"]),
    "an operator's session": lambda t: post("/api/v1/decisions", {"keys": KEYS}, None, HTTP_COOKIE="sessionid=x"),
    "a host not allowed": lambda t: post("/api/v1/decisions", {"keys": KEYS}, t["decide"], HTTP_HOST="evil.example"),
    "a path no view serves": lambda t: post("/api/v1/decisions/nope", {"keys": KEYS}, t["decide"]),
    "a probe": lambda t: lambda: environ("GET", "/healthz"),
}


@pytest.mark.parametrize("case", SERVED)
def test_a_gateways_call_is_served_by_the_front_as_django_answers_it(both, tokens, case):
    plain, fronted, served = both(SERVED[case](tokens))
    assert fronted == plain
    assert served, "Django's handler was called"


@pytest.mark.parametrize("case", HANDED_ON)
def test_anything_else_is_handed_to_django(both, tokens, case):
    plain, fronted, served = both(HANDED_ON[case](tokens))
    # The status and the header fields' names (a page's CSRF token and expiry differ each time).
    assert (fronted[0], [name for name, _ in fronted[1]]) == (plain[0], [name for name, _ in plain[1]])
    assert not served, "the front answered it"


@pytest.mark.parametrize(
    "failure, status", [(RuntimeError("a bug"), "500 Internal Server Error"), (DatabaseError("gone"), "503")]
)
def test_a_failure_in_the_view_is_answered_as_djangos_handler_answers_it(both, tokens, monkeypatch, failure, status):
    def fail(*args, **kwargs):
        raise failure

    monkeypatch.setattr(decisions, "ask", fail)
    plain, fronted, served = both(post("/api/v1/decisions", {"keys": KEYS}, tokens["decide"]))
    assert served and fronted == plain
    assert plain[0].startswith(status) and json.loads(plain[2])["error"]["code"]


def test_a_call_without_a_cookie_skips_the_chain_with_this_projects_middleware(settings):
    # Every middleware of settings.MIDDLEWARE is the console's, or in RUN or LEFT_OUT: a
    # middleware added to neither would send every gateway call through the whole chain.
    assert direct_path() is not None
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.middleware.locale.LocaleMiddleware"]
    assert direct_path() is None
    assert not set(RUN) & set(LEFT_OUT)


# Settings under which a middleware of RUN answers, or adds to the answer, by itself.
MIDDLEWARE_AT_WORK = {
    "an https redirect": ({"SECURE_SSL_REDIRECT": True}, {}),
    "an exempt path": ({"SECURE_SSL_REDIRECT": True, "SECURE_REDIRECT_EXEMPT": [r"^api/"]}, {}),
    "HSTS over https": (
        {"SECURE_HSTS_SECONDS": 3600, "SECURE_HSTS_PRELOAD": True, "SECURE_PROXY_SSL_HEADER": ("HTTP_X_P", "https")},
        {"HTTP_X_P": "https"},
    ),
    "a refused user agent": ({"DISALLOWED_USER_AGENTS": [re.compile("curl")]}, {"HTTP_USER_AGENT": "curl/8"}),
    "PREPEND_WWW": ({"PREPEND_WWW": True}, {}),
    "no security header fields": (
        {"SECURE_CONTENT_TYPE_NOSNIFF": False, "SECURE_REFERRER_POLICY": None, "X_FRAME_OPTIONS": "SAMEORIGIN"},
        {},
    ),
}


@pytest.mark.parametrize("case", MIDDLEWARE_AT_WORK)
def test_the_middleware_that_acts_on_a_gateways_call_acts_as_in_the_chain(tokens, afresh, settings, case):
    changed, headers = MIDDLEWARE_AT_WORK[case]
    settings.ALLOWED_HOSTS = ["localhost", "www.localhost"]
    for name, value in changed.items():
        setattr(settings, name, value)
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        django = Counting()
        front = GatewayFront(django)  # after the settings: its middleware reads them once, as Django's
        call = post("/api/v1/decisions", {"keys": KEYS}, tokens["decide"], **headers)
        afresh()
        plain = send(django, call())
        afresh()
        fronted = send(front, call())
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
    assert fronted == plain
    assert django.calls == 1, "the front handed the call to Django"
    assert not plain[0].startswith("200") or case in ("an exempt path", "HSTS over https", "no security header fields")


@pytest.mark.django_db(transaction=True)
def test_request_finished_closes_a_connection_past_its_age_and_spares_a_young_one(memory_engine, load, policy_doc):
    from django.db import connection

    load(policy_doc)
    token = make_token("decide")
    front = GatewayFront(Counting())
    call = post("/api/v1/decisions", {"keys": KEYS}, token)
    assert send(front, call())[0] == "200 OK"  # the token is proved: the next calls use no query
    finished = []

    def spy(**kwargs):
        finished.append(kwargs["sender"])

    request_finished.connect(spy)
    try:
        connection.ensure_connection()
        connection.close_at = None  # persistent (CONN_MAX_AGE=None): kept, no signal
        assert send(front, call())[0] == "200 OK"
        assert finished == []
        connection.close_at = 0  # past its age: the signal, whose receiver closes it
        assert send(front, call())[0] == "200 OK"
        assert finished == [GatewayFront]
        connection.ensure_connection()  # PostgreSQL's was closed by the signal's receiver
        connection.close_at, connection.errors_occurred = None, True  # an error: the same
        assert send(front, call())[0] == "200 OK"
        assert finished == [GatewayFront, GatewayFront]
    finally:
        request_finished.disconnect(spy)
