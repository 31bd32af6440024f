"""The gateways first (limiter_admin/admission.py): a worker runs at most
LIMITER_CONSOLE_CONCURRENCY console requests at once and turns more away at once; the gateways'
paths never wait there; at 0 a worker serves the gateways alone."""

import json
import threading

import pytest
from django.http import HttpResponse
from django.test import Client, RequestFactory

from limiter_admin.admission import GATEWAY_PATHS, ConsoleAdmission

pytestmark = pytest.mark.django_db


def held_admission(settings, most: int):
    """A ConsoleAdmission whose console requests are held until `release` is set."""
    settings.LIMITER_CONSOLE_CONCURRENCY = most
    release, inside = threading.Event(), threading.Semaphore(0)

    def view(request):
        inside.release()
        release.wait(10)
        return HttpResponse("held")

    return ConsoleAdmission(view), release, inside


def test_console_requests_past_the_bound_get_503_at_once_and_the_gateways_never_wait(settings):
    admission, release, inside = held_admission(settings, 2)
    factory = RequestFactory()
    held = [threading.Thread(target=admission, args=(factory.get("/admin/"),)) for _ in range(2)]
    for thread in held:
        thread.start()
    for _ in held:
        assert inside.acquire(timeout=10)
    try:
        refused = admission(factory.get("/admin/policies/tier/"))
        assert refused.status_code == 503 and refused["Retry-After"] == "1"
        api = admission(factory.get("/api/v1/tiers"))
        assert api.status_code == 503 and json.loads(api.content)["error"]["code"] == "busy"
        # A gateway's path is not a console request: it goes straight on (here, to the held view).
        gateway = threading.Thread(target=admission, args=(factory.post("/api/v1/decisions"),))
        gateway.start()
        assert inside.acquire(timeout=10)
    finally:
        release.set()
        for thread in [*held, gateway]:
            thread.join(10)
    assert admission(factory.get("/admin/")).status_code == 200  # the slots came back


@pytest.mark.parametrize("path", [*GATEWAY_PATHS, "/api/v1/authz/any/path", "/api/v1/leases/x/release"])
def test_every_gateway_path_passes_even_when_the_console_is_full(settings, path):
    admission, release, inside = held_admission(settings, 1)
    release.set()  # the view answers at once
    busy = threading.BoundedSemaphore(1)
    admission.slots = busy
    busy.acquire()  # the console is full
    assert admission(RequestFactory().get(path)).status_code == 200


def test_a_pool_of_the_gateways_own_serves_no_console(settings):
    settings.LIMITER_CONSOLE_CONCURRENCY = 0
    client = Client()
    answer = client.get("/admin/login/")
    assert answer.status_code == 404 and b"serves the gateways&#x27; paths alone" in answer.content
    api = client.get("/api/v1/tiers")
    assert api.status_code == 404 and api.json()["error"]["code"] == "not_found"
    assert client.get("/healthz").status_code == 200
