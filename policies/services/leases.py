"""Lease tickets: what callers hold for a concurrency slot, and releasing one.

Words: a decision that takes a concurrency slot holds it under a *lease* (the engine's
`Decision.lease`, unique per process), which names the slot only together with the keys it
was taken for. The *ticket* is what callers see: the lease and its keys, signed with the
deployment's SECRET_KEY so that nobody can make up a ticket that releases someone else's
slot. The public names carry the ticket as they always did: the REST field `lease`,
forward-auth's `X-Limiter-Lease` and the gRPC service's `x-limiter-lease` header
(`TICKET_HEADER`), and POST /api/v1/leases/<ticket>/release.

    <engine lease>.<the keys: compact JSON, base64url>.<HMAC-SHA256, 16 bytes, base64url>

No state is kept for a ticket: any worker (on the shared Redis store) can release it. The slot is
released at most once by construction: the store removes the engine's lease from each rule's
slots, and a second release (or one after the lease ran out) finds nothing there.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
from collections.abc import Mapping

from django.utils.crypto import salted_hmac

from ..compile import policy_cache
from ..policy import TENANT_LEVEL
from .recording import record_release

# The header that carries a ticket to the upstream (Envoy's, forward-auth's as X-Limiter-Lease).
TICKET_HEADER = "x-limiter-lease"
# Kept from when tickets were made in policies/leases.py: a new salt would void every ticket
# held at the upgrade.
_SALT = "policies.leases"
_MAC_BYTES = 16
# An engine lease is "<12 hex digits>-<hex counter>"; keys are at most a few hundred bytes.
MAX_TICKET = 2048


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(signed: str) -> str:
    return _b64(salted_hmac(_SALT, signed, algorithm="sha256").digest()[:_MAC_BYTES])


def ticket(keys: Mapping[str, str], lease: str | None) -> str | None:
    """The ticket of the engine's `lease`, taken for `keys`; None for no lease."""
    if lease is None:
        return None
    signed = f"{lease}.{_b64(json.dumps(dict(keys), separators=(',', ':'), ensure_ascii=False).encode())}"
    return f"{signed}.{_mac(signed)}"


def read_ticket(text: str) -> tuple[dict[str, str], str] | None:
    """(keys, engine lease) of a ticket `ticket` made; None for anything else."""
    if not isinstance(text, str) or len(text) > MAX_TICKET or not text.isascii():
        return None
    parts = text.split(".")
    if len(parts) != 3:
        return None
    lease, packed, mac = parts
    if not lease or not hmac.compare_digest(mac, _mac(f"{lease}.{packed}")):
        return None
    try:
        keys = json.loads(_unb64(packed))
    except (ValueError, binascii.Error):
        return None
    if not isinstance(keys, dict) or not all(isinstance(v, str) for v in keys.values()):
        return None
    return keys, lease


def release(text: str) -> int:
    """Hand back the slots of the ticket `text`: how many rules gave one back; 0 when it
    names none (unknown, forged, already released, or run out), or the store is down (the
    slot then comes back when its lease runs out)."""
    found = read_ticket(text)
    if found is None:
        return 0
    keys, lease = found
    limiter = policy_cache().limiter_for(keys.get(TENANT_LEVEL))
    # Levels gone from the policy since have no slots left to give back.
    keys = {level: key for level, key in keys.items() if level in limiter.levels}
    released = limiter.release(keys, lease) if keys else 0
    if released:
        record_release(keys, lease)
    return released
