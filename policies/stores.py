"""The limiter's store under Django: Redis through django-redis when REDIS_URL is set (the
pool is configured in CACHES["limiter"]); a Redis Cluster when REDIS_URL is
redis-cluster://... (django-redis has no cluster client: the store makes its own); else one
in-process store for this process."""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings
from django_redis import get_redis_connection

from core import MemoryStore, Store
from core.stores.cluster import ClusterStore, connect_cluster
from core.stores.redis import RedisStore


@lru_cache(maxsize=1)
def limiter_store() -> Store:
    """The store every limiter of this process shares. Call `limiter_store.cache_clear()`
    after changing the settings (tests do)."""
    if settings.REDIS_URL and settings.REDIS_URL.startswith("redis-cluster://"):
        return ClusterStore(
            url=settings.REDIS_URL,
            prefix=settings.LIMITER_KEY_PREFIX,
            timeout=settings.LIMITER_STORE_TIMEOUT,
            batch_timeout=settings.LIMITER_BATCH_TIMEOUT,
            shards=settings.LIMITER_CLUSTER_SHARDS,
            shard_by=settings.LIMITER_CLUSTER_SHARD_BY,
            split=settings.LIMITER_CLUSTER_SPLIT,
            global_mode=settings.LIMITER_CLUSTER_GLOBAL_MODE,
            lease_fraction=settings.LIMITER_CLUSTER_LEASE_FRACTION,
        )
    if settings.REDIS_URL and "limiter" in settings.CACHES:
        return RedisStore(
            client=get_redis_connection("limiter"),
            # Where coroutines connect (policies.embedding's async path), with the same timeout.
            url=settings.REDIS_URL,
            timeout=settings.LIMITER_STORE_TIMEOUT,
            prefix=settings.LIMITER_KEY_PREFIX,
            batch_client=get_redis_connection("limiter_batch"),
            key_format=settings.LIMITER_KEY_FORMAT,
        )
    return MemoryStore()


def statistics_client():
    """The Redis client the denial statistics use: the `default` pool (patient: a 24 h report
    reads ~1,500 keys), or on a cluster a cluster client of its own. None without Redis."""
    if not settings.REDIS_URL:
        return None
    if settings.REDIS_URL.startswith("redis-cluster://"):
        return connect_cluster(settings.REDIS_URL, timeout=1.0, read_timeout=5.0)
    return get_redis_connection("default")
