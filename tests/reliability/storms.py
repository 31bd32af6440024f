"""What an operator or a stranger can throw at the console while gateways decide: a storm of
admin logins (each a fresh username, so no lockout applies) and a storm of what-if replays over
a large record. For tests/reliability/test_console_storm.py and bench/console_storm.py.

    with LoginStorm(service, clients=12) as storm:   # runs until the block ends
        answers = Load(service, ...).run()
    storm.statuses                                    # {200: 31, 429: 2012, ...}
"""

from __future__ import annotations

import http.client
import re
import threading
import time
from collections import Counter
from urllib.parse import urlencode

from core.recorder import DECISION, Record, RedisLog

REQUEST_TIMEOUT = 30.0
_TOKEN = re.compile(rb'name="csrfmiddlewaretoken" value="([^"]+)"')


class Storm:
    """Client threads sending requests in a closed loop until stopped; `statuses` counts the
    answers (None: no HTTP answer)."""

    def __init__(self, service, clients: int) -> None:
        self.service, self.clients = service, clients
        self.statuses: Counter = Counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> Storm:
        self._threads = [threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(self.clients)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(REQUEST_TIMEOUT + 5)

    def _run(self, k: int) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                status = self.send(k, i)
            except (OSError, http.client.HTTPException):
                status = None
            with self._lock:
                self.statuses[status] += 1
            i += 1

    def send(self, k: int, i: int) -> int:
        raise NotImplementedError(f"{type(self).__name__}.send")


class LoginStorm(Storm):
    """Anonymous clients posting the admin's login form, a fresh username each time."""

    def send(self, k: int, i: int) -> int:
        connection = self.service.connection(timeout=REQUEST_TIMEOUT)
        try:
            connection.request("GET", "/admin/login/")
            page = connection.getresponse()
            body = page.read()
            cookie = page.getheader("Set-Cookie", "").split(";", 1)[0]
            found = _TOKEN.search(body)
            form = {
                "username": f"storm-{k}-{i}",
                "password": "not-the-password",
                "csrfmiddlewaretoken": found.group(1).decode() if found else "",
                "next": "/admin/",
            }
            headers = {"Content-Type": "application/x-www-form-urlencoded", "Cookie": cookie}
            connection.request("POST", "/admin/login/", urlencode(form), headers)
            answer = connection.getresponse()
            answer.read()
            return answer.status
        finally:
            connection.close()


class WhatIfStorm(Storm):
    """Operators (an admin token) asking POST /api/v1/whatif over the last hour, again and again."""

    DRAFT = {"tiers": {"free": {"team": [{"type": "token_bucket", "capacity": 5, "per_second": 1}]}}}

    def send(self, k: int, i: int) -> int:
        status, _ = self.service.post("/api/v1/whatif", {"policy": self.DRAFT, "window": "1h"})
        if status == 503:
            time.sleep(0.2)  # told to come back later: a client that obeys, not a flood of 503s
        return status


def fill_record(client, records: int, teams: int = 1000, prefix: str = "la") -> None:
    """`records` recorded decisions of the last half hour in the service's Redis stream, as
    its recorder writes them (core.recorder), for the what-if to replay."""
    log = RedisLog(client, f"{prefix}:{{records}}", records + 1000)
    now = time.time()
    page = [
        Record(now - 1800 + i * 1800 / records, DECISION, {"user": f"u{i % 5000}", "team": f"t{i % teams}"})
        for i in range(records)
    ]
    for start in range(0, records, 10_000):
        log.write(page[start : start + 10_000])
