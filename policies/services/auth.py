"""Who a caller is: a service token from an `Authorization: Bearer la_...` header (or gRPC's
`authorization` metadata), and what its scope lets it do.

| caller | decisions, batches, reservations, releases | everything else |
|---|---|---|
| `decide` token | yes | no |
| `admin` token, staff session | yes | yes |

The REST API applies this through DRF's authentication and permission classes
(policies/api/auth.py), the gateway paths and the gRPC service call it directly.
"""

from __future__ import annotations

from ..tokens import TokenIdentity, find_token
from .errors import Forbidden, Unauthenticated

BEARER_CHALLENGE = 'Bearer realm="limiter"'
# The scopes that may ask for decisions, batches, reservations and releases.
DECIDING_SCOPES = ("decide", "admin")


def bearer_identity(header: str) -> TokenIdentity | None:
    """The identity of an `Authorization: Bearer la_...` header; None when the header names
    no Bearer token (another scheme, or none); Unauthenticated for a bad token."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    if not token or " " in token:
        raise Unauthenticated("malformed Bearer token")
    identity = find_token(token)
    if identity is None:
        raise Unauthenticated("unknown or revoked token")
    return identity


def deciding_identity(header: str, carrier: str = "authorization") -> TokenIdentity:
    """The identity of a header that must carry a token that may decide: Unauthenticated
    without one (or with a bad one), Forbidden for a token whose scope may not decide.
    `carrier` names where the token goes, for the refusal (gRPC: its metadata)."""
    identity = bearer_identity(header)
    if identity is None:
        raise Unauthenticated(f"needs {carrier}: Bearer <decide-scope service token>")
    if identity.scope not in DECIDING_SCOPES:
        raise Forbidden(f"token {identity.name!r} may not decide")
    return identity
