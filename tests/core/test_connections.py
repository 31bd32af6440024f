"""The commands the Redis store packs by hand (core/stores/connections.py) are, byte for byte,
what redis-py's own packers send: its hiredis packer (the one a Connection uses when hiredis is
installed) and its pure-Python one. Checked with redis-py 8.1.0 and hiredis 3.5.0."""

import pytest
from redis.connection import Connection, Encoder, PythonRespSerializer
from redis.utils import HIREDIS_AVAILABLE

from core.stores.connections import ASKING, bulk, command, script_call_start

KEYS = ["la{AbCdEfGhIj}", "la:{s7}:user:u1@acme:1x2y", "é{ü}"]
ARGUMENT = "1700000000.25 2.5 - decide token_bucket 0.0 0 0 100.0,50.0"


def redis_py_packers():
    encoder = Encoder("utf-8", "strict", False)
    packers = {"python": lambda *args: b"".join(PythonRespSerializer(6000, encoder.encode).pack(*args))}
    connection = Connection()
    packers["connection"] = lambda *args: b"".join(connection.pack_command(*args))
    return packers


@pytest.fixture(params=["python", "connection"])
def pack(request):
    return redis_py_packers()[request.param]


@pytest.mark.parametrize("keys", [KEYS, KEYS[:1], []], ids=["three keys", "one key", "no key"])
def test_a_script_call_is_packed_as_redis_py_packs_it(pack, keys):
    ours = (
        script_call_start(b"FCALL", b"limiter_admin_decide_0123456789abcdef", keys, 2)
        + bulk(ARGUMENT.encode())
        + bulk(b"1700000060.25")
    )
    assert ours == pack("FCALL", "limiter_admin_decide_0123456789abcdef", len(keys), *keys, ARGUMENT, "1700000060.25")


def test_an_evalsha_is_packed_as_redis_py_packs_it(pack):
    sha = "0123456789abcdef0123456789abcdef01234567"
    ours = script_call_start(b"EVALSHA", sha.encode(), KEYS, 1) + bulk(ARGUMENT.encode())
    assert ours == pack("EVALSHA", sha, len(KEYS), *KEYS, ARGUMENT)


def test_asking_and_a_whole_command_are_packed_as_redis_py_packs_them(pack):
    assert ASKING == pack("ASKING")
    assert command(b"PING") == pack("PING")
    assert command(b"SET", b"k", b"v\r\n") == pack("SET", "k", "v\r\n")


def test_hiredis_is_installed_so_a_connection_packs_with_it():
    # What the comparison above covers: a Connection packs with hiredis when it is installed.
    assert HIREDIS_AVAILABLE
