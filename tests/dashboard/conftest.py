"""Fixtures for the dashboard's tests: the REST API's engine fixtures (a policy cache and
denial statistics on a real Redis, with a clock that moves only when told), and an operator
logged in to the admin."""

import html as html_lib
import json
import re

import pytest
from django.contrib.auth import get_user_model

# The API's fixtures, shared: the dashboard reads what the API's decisions leave behind.
from core.stores.redis import RedisStore
from tests.api.conftest import api, clock, decide_client, engine, load, memory_engine, policy_doc  # noqa: F401

DASHBOARD = "/admin/dashboard/"


@pytest.fixture
def redis_store(redis_url):
    """The API's Redis store, with a patient socket: a 24 h report reads some 1,500 keys in
    one pipeline, which on a busy test machine can outlast the limiter's 50 ms timeout. How
    the dashboard shows an unreachable store is tested on a store that is really down."""
    store = RedisStore(url=redis_url, timeout=1.0)
    yield store
    store.close()


@pytest.fixture
def operator(db):
    return get_user_model().objects.create_superuser("operator", password="pw-for-tests")


@pytest.fixture
def console(client, operator):
    """The Django test client, logged in as an operator."""
    client.force_login(operator)
    return client


def decide(client, keys, cost=1):
    response = client.post("/api/v1/decisions", {"keys": keys, "cost": cost}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def page(console, path=DASHBOARD, **query):
    response = console.get(path, query)
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def chart_data(html):
    """The blocked_by chart's data, as the page hands it to Chart.js."""
    match = re.search(r'<script id="blocked-chart-data" type="application/json">(.*?)</script>', html, re.S)
    assert match, "the page carries no chart data"
    return json.loads(match.group(1))


def text(html):
    """The page's text, to match sentences in: tags removed, entities read, white space
    squeezed (and none before a comma)."""
    words = re.sub(r"\s+", " ", html_lib.unescape(re.sub(r"<[^>]+>", " ", html))).strip()
    return re.sub(r" ([,.;:?!)])(?= |$)", r"\1", words)
