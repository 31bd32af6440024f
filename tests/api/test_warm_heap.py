"""limiter_admin/warm_heap.py: a serving process freezes its heap once, after its first
`after` requests, with the gc module's own freeze."""

import gc
import json
import os
import runpy
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from limiter_admin.env import env_int
from limiter_admin.warm_heap import FreezeWhenWarm


def answer(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [environ["PATH_INFO"].encode()]


def call(application, path="/healthz"):
    statuses = []
    body = application({"PATH_INFO": path}, lambda status, headers: statuses.append(status))
    return statuses[0], b"".join(body)


@pytest.fixture
def unfrozen():
    """A heap with nothing frozen before the test, and again after it."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_the_heap_is_frozen_at_the_after_th_request_and_not_before(unfrozen):
    application = FreezeWhenWarm(answer, after=3)
    for _ in range(2):
        assert call(application) == ("200 OK", b"/healthz")
    assert gc.get_freeze_count() == 0 and not application.warm
    assert call(application, "/api/v1/decisions") == ("200 OK", b"/api/v1/decisions")
    assert application.warm
    assert gc.get_freeze_count() > 0


def test_it_freezes_once_so_that_what_came_later_is_collected_as_ever(unfrozen):
    application = FreezeWhenWarm(answer, after=1)
    call(application)
    gc.unfreeze()  # what a second freeze would move again
    for _ in range(5):
        call(application)
    assert gc.get_freeze_count() == 0


def test_after_zero_never_freezes(unfrozen):
    application = FreezeWhenWarm(answer, after=0)
    for _ in range(50):
        call(application)
    assert application.warm and gc.get_freeze_count() == 0


def test_threads_racing_through_the_count_never_skip_the_freeze(unfrozen):
    application = FreezeWhenWarm(answer, after=4000)
    start = threading.Barrier(8)

    def serve():
        start.wait()
        for _ in range(500):
            call(application)

    threads = [threading.Thread(target=serve) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert application.warm and gc.get_freeze_count() > 0


def test_the_served_application_freezes_after_the_setting_and_switches_threads_every_ms(tmp_path):
    """In a process of its own: importing the WSGI module sets the interpreter's switch
    interval and starts the alerts' evaluation, neither of which the test session may keep."""
    script = (
        "import json, sys\n"
        "from django.conf import settings\n"
        "from limiter_admin.warm_heap import FreezeWhenWarm\n"
        "from limiter_admin.wsgi import SWITCH_INTERVAL, application\n"
        "print(json.dumps([isinstance(application, FreezeWhenWarm), application.after,\n"
        "    settings.LIMITER_GC_FREEZE_AFTER, SWITCH_INTERVAL, sys.getswitchinterval()]))\n"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "limiter_admin.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3",
        "LIMITER_GC_FREEZE_AFTER": "250",
    }
    env.pop("REDIS_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    wrapped, after, setting, interval, switching = json.loads(done.stdout.splitlines()[-1])
    assert wrapped and after == setting == 250
    assert interval == 0.001 and switching == pytest.approx(interval)


@pytest.mark.parametrize("raw", ["-1", "soon"])
def test_a_freeze_after_that_is_no_count_stops_the_settings_by_name(monkeypatch, raw):
    monkeypatch.setenv("LIMITER_GC_FREEZE_AFTER", raw)
    with pytest.raises(ImproperlyConfigured, match=f"LIMITER_GC_FREEZE_AFTER='{raw}'"):
        runpy.run_path(str(Path(settings.BASE_DIR) / "limiter_admin" / "settings.py"))


def test_env_int_takes_its_minimum():
    assert env_int("LIMITER_NOT_SET_ANYWHERE", 7, minimum=0) == 7
