"""The wire of the Redis store's script calls: commands packed in advance (RESP) and sent on
connections held out of a redis-py pool, rather than through redis-py's command path.

redis-py 8.1 spends about 20 us around every command: the pool's checkout and release (a
lock, a poll of the socket, telemetry hooks), the retry wrapper and the encoder. A call here
costs a deque pop and append, a write and a read. The pool still makes, connects and
configures every connection (timeouts, TLS, authentication, the hand-shake).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import redis
from redis.exceptions import RedisError, ResponseError

# A held connection idle for longer than this is checked before use (see HeldConnections).
IDLE_CHECK = 0.001


def bulk(data: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(data), data)


class HeldConnections:
    """Connections taken from a redis-py pool once and kept for script calls, which send a
    command packed in advance and read its reply on one of them. One per pool, shared by
    every store on it (`held_connections`): it holds as many connections as calls were
    ever made at once, whatever the number of stores.

    What the pool's poll of the socket was for, a connection the server closed while it sat
    idle (a restart, `CLIENT KILL`), is checked only for one idle longer than IDLE_CHECK; the
    poll costs a system call, about as much as the rest of the call. The trade-off: one
    closed in the last millisecond before its use fails that call, which then gets its fail
    mode, as a connection closed during the call always did. A child process (fork) holds
    none of its parent's connections.
    """

    def __init__(self, pool: redis.ConnectionPool, clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = weakref.ref(pool)  # the pool's entry in _HELD must not keep it alive
        self.clock = clock
        self.idle: deque = deque()  # (connection, when it went idle), the latest last

    def call(self, command: bytes) -> Any:
        """Send `command` (RESP, packed) and read its reply; raise what redis-py raises."""
        try:
            connection, since = self.idle.pop()
        except IndexError:
            connection, since = self._new_connection(), None
        try:
            if since is not None and self.clock() - since > IDLE_CHECK:
                _make_ready(connection)
            connection.send_packed_command((command,))
            return connection.read_response()
        except ResponseError:
            raise  # a whole reply was read: the connection is ready for the next call
        except BaseException:
            # Whatever stopped us (redis-py has disconnected on its own errors), a reply
            # to this command may still come: it must never be read as another's answer.
            connection.disconnect()
            raise
        finally:
            self.idle.append((connection, self.clock()))

    def _new_connection(self) -> Any:
        pool = self.pool()
        if pool is None:  # its client is gone, and so are the stores that called through it
            raise redis.ConnectionError("the connection pool is gone")
        return pool.get_connection()

    def close(self) -> None:
        """Give the idle connections back to the pool."""
        pool = self.pool()
        while self.idle:
            connection = self.idle.pop()[0]
            if pool is not None:
                pool.release(connection)


def _make_ready(connection: Any) -> None:
    """Disconnect a connection that the server closed, or that holds data nobody asked for:
    sending on it connects it again (one attempt, within the connect timeout)."""
    if not connection.is_connected:
        return  # can_read() would connect it, and a failure there would cost a second try
    try:
        if not connection.can_read():
            return
    except (RedisError, OSError):
        pass
    connection.disconnect()


# The HeldConnections of each pool of this process.
_HELD: weakref.WeakKeyDictionary[Any, HeldConnections] = weakref.WeakKeyDictionary()
_HELD_LOCK = threading.Lock()


def held_connections(pool: redis.ConnectionPool) -> HeldConnections:
    """The HeldConnections of `pool`, made on first use."""
    with _HELD_LOCK:
        held = _HELD.get(pool)
        if held is None:
            held = _HELD[pool] = HeldConnections(pool)
        return held


def _forget_held_connections() -> None:
    """In a child process: its parent's sockets are not ours to use."""
    for held in list(_HELD.values()):
        held.idle.clear()  # dropping them closes only the child's copy


os.register_at_fork(after_in_child=_forget_held_connections)


__all__ = ["IDLE_CHECK", "HeldConnections", "bulk", "held_connections"]
