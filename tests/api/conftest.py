"""Fixtures for the REST API's tests: the example policy loaded in the database, a policy
cache on a real Redis with a clock that moves only when told, and API clients holding
service tokens of each scope.

`make_token(scope)` goes through `manage.py createservicetoken`, as an operator would, and
reads the token from the last line it prints.
"""

import copy
import io

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from core import ManualClock, MemoryStore
from core.stats import DenialStats
from core.stores.redis import RedisStore
from policies.compile import PolicyCache, install_policy_cache
from policies.policyfile import load_policy
from policies.telemetry import install_denial_stats
from tests.policies.conftest import POLICY, START


@pytest.fixture
def clock():
    return ManualClock(START.timestamp())


@pytest.fixture
def policy_doc():
    """A fresh copy of SPEC.md's example policy, to change before `api` loads it."""
    return copy.deepcopy(POLICY)


@pytest.fixture
def load(django_capture_on_commit_callbacks):
    """Load a policy document and commit it (the hooks run: the policy version moves)."""

    def load(doc):
        with django_capture_on_commit_callbacks(execute=True):
            return load_policy(doc)

    return load


@pytest.fixture
def redis_store(redis_url):
    store = RedisStore(url=redis_url)
    yield store
    store.close()


@pytest.fixture
def engine(db, redis_store, clock):
    """The process's policy cache and denial statistics, on the test's Redis and clock."""
    cache = PolicyCache(store=redis_store, clock=clock, limiter_clock=clock)
    # No flushing thread: a report flushes first, and round-trip counts stay exact.
    stats = DenialStats(client=redis_store.client, clock=clock, flush_every=None)
    install_policy_cache(cache)
    install_denial_stats(stats)
    yield cache
    install_policy_cache(None)
    install_denial_stats(None)


@pytest.fixture
def memory_engine(db, clock):
    """The same on the in-process store, for tests that are about the API, not Redis."""
    cache = PolicyCache(store=MemoryStore(), clock=clock, limiter_clock=clock)
    install_policy_cache(cache)
    install_denial_stats(DenialStats(clock=clock, flush_every=None))
    yield cache
    install_policy_cache(None)
    install_denial_stats(None)


@pytest.fixture
def api(engine, load, policy_doc):
    """SPEC.md's example policy, loaded, on Redis."""
    load(policy_doc)
    return engine


def make_token(scope: str = "decide", name: str = "gateway") -> str:
    out = io.StringIO()
    call_command("createservicetoken", name, "--scope", scope, stdout=out)
    return out.getvalue().strip().splitlines()[-1]


def token_client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.fixture
def decide_client(db):
    """An APIClient with a decide-scope token."""
    return token_client(make_token("decide"))


@pytest.fixture
def admin_api_client(db):
    """An APIClient with an admin-scope token."""
    return token_client(make_token("admin", "ops-script"))


@pytest.fixture
def staff_client(db, django_user_model):
    """An APIClient logged in as an operator (staff), enforcing CSRF as a browser would."""
    user = django_user_model.objects.create_user("operator", password="x", is_staff=True)
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    return client
