"""Fixtures for the tests of a Redis that loses the store's Lua (a restart without
persistence, a flush), for the single decision's tests and the batch's alike."""

import pytest

from tests.conftest import RedisServer


@pytest.fixture
def redis_without_functions(tmp_path):
    """A redis-server that answers FCALL and FUNCTION as unknown commands, as Redis 6 does."""
    server = RedisServer(
        tmp_path, options=("--rename-command", "FCALL", "", "--rename-command", "FUNCTION", "")
    ).start()
    yield server
    server.kill()


@pytest.fixture(params=["FUNCTION FLUSH", "SCRIPT FLUSH on a Redis without functions"])
def losing_the_lua(request):
    """(url, flush): a server, and what makes it forget our Lua. On Redis 7 the store calls
    a function library, which FUNCTION FLUSH removes; a server without functions gets the
    Lua as a script, which SCRIPT FLUSH removes."""
    if request.param == "FUNCTION FLUSH":
        server, url = request.getfixturevalue("redis_server"), request.getfixturevalue("redis_url")
        admin = server.client()
        return url, lambda: admin.function_flush("SYNC")
    server = request.getfixturevalue("redis_without_functions")
    return server.url, server.client().script_flush
