"""policies.E002: a Redis Cluster's settings are checked at start-up, not by the first
decision; and under those settings the limiter's store is a ClusterStore."""

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from core.stores.cluster import ClusterStore
from policies.checks import check_cluster_settings
from policies.stores import limiter_store, statistics_client


@pytest.fixture
def fresh_store():
    limiter_store.cache_clear()
    yield
    limiter_store.cache_clear()


def test_without_a_cluster_url_there_is_nothing_to_check(settings):
    settings.REDIS_URL = "redis://127.0.0.1:6379/0"
    assert check_cluster_settings() == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    "name, value, named",
    [
        ("REDIS_URL", "redis-cluster://127.0.0.1:7000,nowhere", "'nowhere' is not host:port"),
        ("REDIS_URL", "redis-cluster://127.0.0.1:99999", "is not host:port"),
        ("LIMITER_CLUSTER_SHARDS", 0, "shards"),
        ("LIMITER_CLUSTER_GLOBAL_MODE", "sometimes", "global_mode"),
        ("LIMITER_CLUSTER_LEASE_FRACTION", 1.5, "lease_fraction"),
    ],
)
def test_bad_cluster_settings_are_a_start_up_error_that_names_them(settings, name, value, named):
    settings.REDIS_URL = "redis-cluster://127.0.0.1:7000,127.0.0.1:7001"
    setattr(settings, name, value)
    errors = check_cluster_settings()
    assert [error.id for error in errors] == ["policies.E002"]
    assert named in errors[0].msg
    with pytest.raises(SystemCheckError, match="policies.E002"):
        call_command("check")


@pytest.mark.django_db
def test_a_cluster_url_makes_a_cluster_store_with_the_settings(settings, redis_cluster_url, fresh_store):
    settings.REDIS_URL = redis_cluster_url
    settings.LIMITER_CLUSTER_SHARDS = 8
    settings.LIMITER_CLUSTER_GLOBAL_MODE = "lease"
    store = limiter_store()
    assert isinstance(store, ClusterStore)
    assert (store.shards, store.global_mode, store.shard_by) == (8, "lease", "team")
    store.ping()
    client = statistics_client()
    assert client.ping()
    client.close()


def test_an_unknown_key_format_is_a_start_up_error(settings):
    from policies.checks import check_key_format

    assert check_key_format() == []
    settings.LIMITER_KEY_FORMAT = "short"
    assert [error.id for error in check_key_format()] == ["policies.E003"]
