"""End to end: the embedded limiter in real servers on a real Redis. 4 gunicorn workers (sync
views) and 4 uvicorn workers (an async view) flood a decorated view and a DRF view whose limit
is N: exactly N pass, in both. And under uvicorn, while Redis holds every command (CLIENT
PAUSE), an async view waiting on its decision does not hold up the event loop: another view
on the same loop answers at once.

The views are tests/embedding_urls.py's, served under tests.embedding_settings.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.embedding_urls import LIMIT
from tests.serving import Service

# Served on a database of their own (tests/serving.py): PostgreSQL's pass would repeat them.
pytestmark = [pytest.mark.slow, pytest.mark.sqlite]

POLICY = {
    "default_tier": "embed",
    "levels": [{"name": "user"}, {"name": "team"}, {"name": "global"}],
    "tiers": {"embed": {"user": [{"type": "token_bucket", "capacity": LIMIT, "per_second": 0}]}},
}
ENV = {
    "DJANGO_SETTINGS_MODULE": "tests.embedding_settings",
    # A patient store: on a busy host a reply may take longer than the 50 ms default, and a
    # degraded answer is not what this counts (test_embedding.py tests the fail modes).
    "LIMITER_STORE_TIMEOUT": "2.0",
    # The flooded views are not gateway paths: let the console admission take them all.
    "LIMITER_CONSOLE_CONCURRENCY": "64",
}
REQUESTS = 4 * LIMIT


def flood(service, path):
    """REQUESTS requests at `path` from 32 threads at once; (status, body) of each."""
    with ThreadPoolExecutor(max_workers=32) as pool:
        return list(pool.map(lambda _: service.get(path), range(REQUESTS)))


def assert_exactly_the_limit_passed(answers):
    statuses = [status for status, _ in answers]
    assert statuses.count(200) == LIMIT, statuses
    assert statuses.count(429) == REQUESTS - LIMIT
    passed = [body for status, body in answers if status == 200]
    assert sorted(body["remaining"] for body in passed) == list(range(LIMIT))  # each took one
    denied = [body for status, body in answers if status == 429]
    assert all(body["error"]["code"] == "rate_limited" for body in denied)
    pids = {body["pid"] for _, body in answers if "pid" in body}
    assert len(pids) >= 2, f"one worker served everything: {pids}"


@pytest.mark.parametrize(
    "server, path",
    [
        ("gunicorn", "/embedded/sync"),
        ("gunicorn", "/embedded/drf"),
        ("uvicorn", "/embedded/async"),
        ("uvicorn", "/embedded/drf"),
    ],
)
def test_4_workers_flooding_a_limited_view_let_exactly_the_limit_through(redis_url, server, path):
    with Service(POLICY, redis_url=redis_url, workers=4, extra_env=ENV, server=server) as service:
        answers = flood(service, path)
    assert_exactly_the_limit_passed(answers)


def test_while_redis_is_paused_an_async_view_waiting_on_it_leaves_the_loop_free(redis_url, redis_server):
    with Service(POLICY, redis_url=redis_url, workers=1, extra_env=ENV, server="uvicorn") as service:
        assert service.get("/embedded/async")[0] == 200  # connected, the Lua library loaded
        usual = min(_timed(service, "/embedded/ping") for _ in range(5))
        pauser = redis_server.client(socket_timeout=5)
        pauser.execute_command("CLIENT", "PAUSE", "1500", "ALL")
        limited = {}
        waiting = threading.Thread(target=lambda: limited.update(answer=_timed_answer(service, "/embedded/async")))
        waiting.start()
        time.sleep(0.3)  # let the limited request reach Redis and wait there (not an edge under test)
        during = [_timed(service, "/embedded/ping") for _ in range(5)]
        waiting.join()
        pauser.close()
    (status, body), took = limited["answer"]
    assert status == 200 and took >= 1.0, "the limited request waited for Redis"
    assert max(during) < max(0.25, 10 * usual), f"the loop was held up: {during} (usually {usual:.4f} s)"


def _timed(service, path):
    return _timed_answer(service, path)[1]


def _timed_answer(service, path):
    started = time.monotonic()
    answer = service.get(path)
    return answer, time.monotonic() - started
