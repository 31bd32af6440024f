"""Stores hold rule state; pick one by URL."""

from __future__ import annotations

from urllib.parse import urlsplit

from ..errors import ConfigError
from .base import Check, Outcome, Store
from .memory import MemoryStore

__all__ = ["Check", "MemoryStore", "Outcome", "Store", "store_from_url"]


def store_from_url(url: str, **options) -> Store:
    """`memory://` for this process; `redis://host:port/db` once the Redis store exists."""
    scheme = urlsplit(url).scheme if isinstance(url, str) else ""
    if scheme == "memory":
        return MemoryStore(**options)
    raise ConfigError(f"unsupported store URL {url!r} (known schemes: memory)", "store")
