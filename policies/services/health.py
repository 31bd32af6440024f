"""Whether this worker can serve: the policy database and the limiter's store, each probed.
What /readyz answers and the console's health panel shows."""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError

from core import StoreUnavailable

from ..compile import policy_cache
from ..signals import current_version


def readiness() -> dict[str, str]:
    """{"database": ..., "store": ...}, each "ok" or "unreachable: <why>"."""
    checks = {"database": "ok", "store": "ok"}
    try:
        # A read of what workers poll, not `SELECT 1`: SQLite answers that without opening
        # its file, so an unreadable database would pass.
        current_version()
    except DatabaseError as error:
        checks["database"] = f"unreachable: {error}"
    store = policy_cache().store
    try:
        store.ping()
    except StoreUnavailable as error:
        down = ", ".join(part["name"] for part in store.health() if part["state"] != "up")
        checks["store"] = f"unreachable: {error}" + (f" (down: {down})" if down else "")
    return checks


def store_health() -> dict[str, Any]:
    """Up, or down and since when (epoch seconds), for each part of the store (a cluster's
    primaries), as the store's health() reports it after a ping (the stores' probe)."""
    store = policy_cache().store
    try:
        store.ping()
        error = None
    except StoreUnavailable as failure:
        error = str(failure)
    parts = [
        {
            "name": part["name"],
            "up": part["state"] == "up",
            "down_since": part["down_since"],
            "failures": part["failures"],
        }
        for part in store.health()
    ]
    return {"up": error is None and all(part["up"] for part in parts), "error": error, "parts": parts}
