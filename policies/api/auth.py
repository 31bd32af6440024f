"""Who may call what: service tokens (Bearer) and operators' admin sessions.

| caller | decisions, batches, reservations | everything else |
|---|---|---|
| `decide` token | yes | 403 |
| `admin` token, staff session | yes | yes |
| non-staff session | 403 | 403 |
| nobody, a bad or revoked token | 401 | 401 |

Session calls that change something need the CSRF token (DRF's SessionAuthentication
enforces it); token calls do not, since a browser never sends a Bearer token by itself.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions

from policies.services.auth import BEARER_CHALLENGE, DECIDING_SCOPES, bearer_identity
from policies.services.errors import Unauthenticated
from policies.tokens import TokenIdentity


class TokenUser:
    """What `request.user` is for a token call: not a Django user, and never staff."""

    is_authenticated = True
    is_active = True
    is_staff = False
    is_superuser = False

    def __init__(self, identity: TokenIdentity) -> None:
        self.identity = identity
        self.username = f"token:{identity.name}"

    def __str__(self) -> str:
        return self.username


class ServiceTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer la_...`; `request.auth` is the token's TokenIdentity."""

    keyword = "Bearer"

    def authenticate(self, request):
        try:
            identity = bearer_identity(request.META.get("HTTP_AUTHORIZATION", ""))
        except Unauthenticated as error:  # DRF's own exception, so that DRF adds its challenge
            raise exceptions.AuthenticationFailed(error.reason) from None
        return None if identity is None else (TokenUser(identity), identity)

    def authenticate_header(self, request):
        return BEARER_CHALLENGE


def scope_of(request) -> str | None:
    """`admin`, `decide`, or None for a caller with no API rights."""
    if isinstance(request.auth, TokenIdentity):
        return request.auth.scope
    user = request.user
    if user is not None and user.is_authenticated and user.is_active and user.is_staff:
        return "admin"
    return None


class CanDecide(permissions.BasePermission):
    """Decisions, batches and reservations: any token, or a staff session."""

    message = "this call needs a decide or admin token, or an operator's session"

    def has_permission(self, request, view):
        return scope_of(request) in DECIDING_SCOPES


class IsOperator(permissions.BasePermission):
    """Everything else: an admin token, or a staff session."""

    message = "this call needs an admin token or an operator's session"

    def has_permission(self, request, view):
        return scope_of(request) == "admin"


class ServiceTokenScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI schema names the token scheme."""

    target_class = ServiceTokenAuthentication
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A token from `manage.py createservicetoken NAME --scope decide|admin`.",
        }
