"""A real HTTP receiver of webhooks on loopback, for the alerts' tests: it keeps every request
it gets (path, headers, body) and answers as the test says: a status for each request in
turn (then 200), or holding every answer until the test lets it go (a slow receiver).

    with Receiver() as receiver:
        receiver.statuses = [500, 500]      # fail twice, then take deliveries
        receiver.hold()                     # answer nothing until receiver.release()
        receiver.wait_for(1)                # until one request has come in
        receiver.requests[0].json()
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple

WAIT = 30.0  # seconds a test waits for what must happen at once: only a failure waits this long


class Received(NamedTuple):
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.statuses: list[int] = []
        self.arrived = threading.Condition()
        self.released = threading.Event()
        self.released.set()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="receiver", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/limiter"

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(WAIT)

    def hold(self) -> None:
        """Answer nothing (the request is read, the answer waits) until release()."""
        self.released.clear()

    def release(self) -> None:
        self.released.set()

    def wait_for(self, count: int, timeout: float = WAIT) -> list[Received]:
        """The requests, once at least `count` have come in."""
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.requests) >= count, timeout), (
                f"{len(self.requests)} requests came in, not {count}"
            )
            return list(self.requests)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.arrived:
                    receiver.requests.append(Received(self.path, dict(self.headers.items()), body))
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                    receiver.arrived.notify_all()
                receiver.released.wait(WAIT)
                answer = b"ok" if status < 300 else b"the receiver is down"
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: the tests read self.requests

        return Handler
