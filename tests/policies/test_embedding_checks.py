"""The embedded limiter's start-up checks (policies/checks.py): each fires on its case, and
only on it."""

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from policies import checks
from policies.checks import (
    check_embedded_callables,
    check_embedded_store,
    check_embedded_tiers,
    check_ip_settings,
    served_workers,
)
from policies.embedding import ViewLimit

from .conftest import POLICY

THROTTLE = {"rate": "10/s"}


@pytest.fixture
def no_decorated_views(monkeypatch):
    monkeypatch.setattr(checks, "DECORATED", [])


@pytest.fixture
def in_process(settings, monkeypatch, no_decorated_views):
    """No shared store, no worker count in the environment, no embedded limit."""
    settings.REDIS_URL = ""
    monkeypatch.delenv("WEB_CONCURRENCY", raising=False)
    monkeypatch.delenv("GUNICORN_CMD_ARGS", raising=False)


@pytest.mark.parametrize(
    "environment, workers",
    [
        ({}, 1),
        ({"WEB_CONCURRENCY": "4"}, 4),
        ({"GUNICORN_CMD_ARGS": "--preload -w 3"}, 3),
        ({"GUNICORN_CMD_ARGS": "--workers=5"}, 5),
        ({"WEB_CONCURRENCY": "x"}, 1),
    ],
)
def test_the_worker_count_comes_from_the_servers_own_environment(in_process, monkeypatch, environment, workers):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert served_workers() == workers


@pytest.mark.django_db
def test_an_embedded_limit_in_process_memory_under_several_workers_is_policies_e009(in_process, settings, monkeypatch):
    settings.LIMITER_THROTTLE = THROTTLE
    assert check_embedded_store() == []  # one process: its memory is the one store
    monkeypatch.setenv("WEB_CONCURRENCY", "4")
    errors = check_embedded_store()
    assert [error.id for error in errors] == ["policies.E009"]
    assert "LIMITER_THROTTLE" in errors[0].msg and "4 workers" in errors[0].msg
    with pytest.raises(SystemCheckError, match="policies.E009"):
        call_command("check")
    settings.REDIS_URL = "redis://127.0.0.1:6379/0"
    assert check_embedded_store() == []  # a shared store: exact across the workers


def test_a_decorated_view_counts_as_an_embedded_limit(in_process, monkeypatch):
    monkeypatch.setenv("GUNICORN_CMD_ARGS", "-w 2")
    assert check_embedded_store() == []
    monkeypatch.setattr(checks, "DECORATED", [ViewLimit({"rate": "1/s"}, "myapp.views.export", "export")])
    assert "@limit on myapp.views.export" in check_embedded_store()[0].msg


@pytest.mark.django_db
def test_a_tier_the_policy_does_not_have_is_policies_w001(in_process, settings, load):
    load(POLICY)
    settings.LIMITER_THROTTLE = {"tier": "pro"}
    assert check_embedded_tiers() == []
    settings.LIMITER_MIDDLEWARE = {"paths": ["/x/"], "tier": "platinum"}
    warnings = check_embedded_tiers()
    assert [w.id for w in warnings] == ["policies.W001"]
    assert "LIMITER_MIDDLEWARE" in warnings[0].msg and "'platinum'" in warnings[0].msg
    assert "free, pro" in warnings[0].msg


def test_a_key_function_that_does_not_import_is_policies_w002(in_process, settings):
    settings.LIMITER_THROTTLE = {"rate": "1/s", "key": "policies.embedding.client_key", "team": "myapp.nowhere.team"}
    warnings = check_embedded_callables()
    assert [w.id for w in warnings] == ["policies.W002"]
    assert warnings[0].msg.startswith("LIMITER_THROTTLE[\"team\"]: cannot import 'myapp.nowhere.team'")


@pytest.mark.parametrize(
    "header, proxies, bad",
    [(None, 1, 0), ("X-Forwarded-For", 2, 0), ("X Forwarded", 1, 1), (None, 0, 1), ("X-Real-IP", "2", 1)],
)
def test_the_proxy_settings_are_checked_as_policies_e010(settings, header, proxies, bad):
    settings.LIMITER_IP_HEADER, settings.LIMITER_IP_PROXIES = header, proxies
    assert [error.id for error in check_ip_settings()] == ["policies.E010"] * bad
