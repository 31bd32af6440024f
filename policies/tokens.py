"""Service tokens: made once, stored as a digest, looked up on every API call.

    token = issue_token("gateway", scope="decide")   # shown once, never stored
    found = find_token(token)                          # a ServiceToken, or None

A token reads `la_<prefix>_<secret>`. The prefix finds the row; the SHA-256 digest of the
whole token, compared in constant time, proves it. A valid token is remembered in process
for `CACHE_SECONDS`, so a warm decision costs no database query; revoking a token reaches
this process at once (a signal clears the cache) and every other worker within that time.

While the database cannot be reached, a token this process has already proved keeps
working (decisions go on, as they do on the last policy read); nothing can be revoked then
anyway. A token it has not seen raises the DatabaseError (the API's 503).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from typing import NamedTuple

from django.db import DatabaseError
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from .models import TOKEN_SCOPES, ServiceToken

log = logging.getLogger(__name__)

PREFIX_LENGTH = 12
CACHE_SECONDS = 2.0
SCOPES = tuple(scope for scope, _ in TOKEN_SCOPES)


class TokenIdentity(NamedTuple):
    """Who a valid token speaks for: what the API's permission checks read."""

    id: int
    name: str
    scope: str


_cache: dict[str, tuple[TokenIdentity, float]] = {}
_cache_lock = threading.Lock()


def digest_of(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue_token(name: str, scope: str = "decide") -> tuple[ServiceToken, str]:
    """Make a token; returns its row and the token itself (the only time it is seen)."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r} (known: {', '.join(SCOPES)})")
    prefix = secrets.token_hex(PREFIX_LENGTH // 2)
    token = f"la_{prefix}_{secrets.token_urlsafe(32)}"
    row = ServiceToken.objects.create(name=name, scope=scope, prefix=prefix, digest=digest_of(token))
    return row, token


def find_token(token: str, now: float | None = None) -> TokenIdentity | None:
    """The identity of a valid, unrevoked token; None for anything else."""
    now = time.monotonic() if now is None else now
    digest = digest_of(token)
    cached = _cache.get(digest)
    if cached is not None and cached[1] > now:
        return cached[0]
    parts = token.split("_")
    if len(parts) < 3 or parts[0] != "la" or len(parts[1]) != PREFIX_LENGTH:
        return None
    if cached is not None:
        # While this thread asks the database (which may hang as long as its timeout), the
        # worker's other threads go on trusting the token rather than each waiting too.
        with _cache_lock:
            _cache[digest] = (cached[0], now + CACHE_SECONDS)
    try:
        row = (
            ServiceToken.objects.filter(prefix=parts[1], revoked_at__isnull=True)
            .only("id", "name", "scope", "digest")
            .first()
        )
    except DatabaseError as error:
        if cached is None:
            raise
        # Proved before the outage; a revocation needs the database too, so none is missed
        # but one made in another worker less than CACHE_SECONDS before the outage began.
        # Trusted for CACHE_SECONDS more: the database is asked again then, not per request.
        log.warning("token lookup failed, trusting token %r as proved before: %s", cached[0].name, error)
        with _cache_lock:
            _cache[digest] = (cached[0], now + CACHE_SECONDS)
        return cached[0]
    if row is None or not hmac.compare_digest(row.digest, digest):
        with _cache_lock:
            _cache.pop(digest, None)  # revoked (or gone) since it was proved
        return None
    identity = TokenIdentity(row.id, row.name, row.scope)
    with _cache_lock:
        if len(_cache) > 10_000:
            _cache.clear()  # bounded: a flood of distinct valid tokens only costs queries
        _cache[digest] = (identity, now + CACHE_SECONDS)
    return identity


@receiver(post_save, sender=ServiceToken)
@receiver(post_delete, sender=ServiceToken)
def _forget_cached_tokens(**_):
    with _cache_lock:
        _cache.clear()
