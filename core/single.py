"""A single-level facade: `allow_request(client_id) -> bool`, for middleware.

Middleware depends only on `allow_request`; the algorithm behind it is whatever rule spec
the limiter was built from, so swapping it changes no call site.
"""

from __future__ import annotations

from collections.abc import Callable

from .limiter import Decision, HierarchicalLimiter
from .stores import Store

LEVEL = "client"


class ClientLimiter:
    """Per-client limits from one or more rule specs, one level deep."""

    def __init__(
        self, rules: dict | list[dict], store: Store | None = None, clock: Callable[[], float] | None = None
    ) -> None:
        specs = [rules] if isinstance(rules, dict) else list(rules)
        self.limiter = HierarchicalLimiter.from_config({LEVEL: specs}, store, clock)

    def allow_request(self, client_id: str, cost: float = 1) -> bool:
        return self.limiter.acquire({LEVEL: client_id}, cost).allowed

    def decide(self, client_id: str, cost: float = 1) -> Decision:
        """The full decision, for callers that want `retry_after` (a 429's Retry-After)."""
        return self.limiter.acquire({LEVEL: client_id}, cost)
