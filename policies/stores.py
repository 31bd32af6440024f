"""The limiter's store under Django: Redis through django-redis when REDIS_URL is set (the
pool is configured in CACHES["limiter"]), else one in-process store for this process."""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings

from core import MemoryStore, Store


@lru_cache(maxsize=1)
def limiter_store() -> Store:
    """The store every limiter of this process shares. Call `limiter_store.cache_clear()`
    after changing the settings (tests do)."""
    if settings.REDIS_URL and "limiter" in settings.CACHES:
        from django_redis import get_redis_connection

        from core.stores.redis import RedisStore

        return RedisStore(client=get_redis_connection("limiter"), prefix=settings.LIMITER_KEY_PREFIX,
                          batch_client=get_redis_connection("limiter_batch"))
    return MemoryStore()
