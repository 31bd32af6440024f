"""Stores hold rule state; pick one by URL."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigError
from .base import Check, Health, Store
from .memory import MemoryStore

__all__ = ["Check", "Health", "MemoryStore", "Store", "store_from_url"]


def store_from_url(url: str, **options: Any) -> Store:
    """`memory://` for this process; `redis://host:port/db` (or `rediss://`, `unix://`)
    for state shared by every process that uses the same Redis; `redis-cluster://host:port
    [,host:port...]` for a Redis Cluster (see stores/cluster.py for its key layout)."""
    scheme = urlsplit(url).scheme if isinstance(url, str) else ""
    if scheme == "memory":
        return MemoryStore(**options)
    if scheme in ("redis", "rediss", "unix"):
        from .redis import RedisStore  # imported here so that memory:// needs no redis-py

        return RedisStore(url=url, **options)
    if scheme == "redis-cluster":
        from .cluster import ClusterStore  # here too: memory:// needs no redis-py

        return ClusterStore(url=url, **options)
    raise ConfigError(
        f"unsupported store URL {url!r} (known schemes: memory, redis, rediss, unix, redis-cluster)", "store"
    )
