"""The operators' policy CRUD: /api/v1/tiers, /tenants, /levels, /priorities, /alerts and /settings.

Rows are addressed by their natural key (a tier's or level's name, a tenant's key), never
by id. Every write runs in one transaction: a tier or tenant and its rules are saved
together or not at all. Tiers, tenants, levels, priority classes and alerts are versioned: PUT and
PATCH send the version they read and get a 409 if it moved. Every committed write bumps the policy version (the
models' signals), so each worker decides with it within a second.

The shapes and their validation are in `serializers` (one module per resource).
"""

from __future__ import annotations

from urllib.parse import quote

from django.db import IntegrityError, transaction
from django.db.models import ProtectedError
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import generics
from rest_framework.pagination import LimitOffsetPagination

from policies.integrity import check_deletable
from policies.invariants import PolicyViolation
from policies.models import Alert, Level, PolicySettings, PriorityClass, StaleVersion, Tenant, Tier
from policies.services.errors import conflict, invalid, not_found

from . import schemas
from . import serializers as shapes
from .auth import IsOperator

TAGS = ["policy"]
CONFLICT = {
    409: OpenApiResponse(
        schemas.Error, description="Changed since you read it (a stale version), a name already taken, or still in use."
    )
}
WRITE_ERRORS = {**schemas.ERRORS, **CONFLICT}
ITEM_ERRORS = {**schemas.ERRORS, **schemas.NOT_FOUND}


class PolicyPagination(LimitOffsetPagination):
    """Policies are small: one page holds everything unless `limit` asks for less. As strict
    as every other input: a `limit` or `offset` that is not a whole number is a 400, where
    DRF would quietly use its default (a `limit` above 1,000 still reads as 1,000)."""

    default_limit = 1000
    max_limit = 1000
    LEAST = {"limit": 1, "offset": 0}

    def get_limit(self, request):
        return min(self._whole_number(request, self.limit_query_param, self.default_limit), self.max_limit)

    def get_offset(self, request):
        return self._whole_number(request, self.offset_query_param, 0)

    def _whole_number(self, request, name: str, default: int) -> int:
        raw = request.query_params.get(name)
        if raw is None:
            return default
        least = self.LEAST[name]
        if not raw.isascii() or not raw.isdigit() or int(raw) < least:
            raise invalid(name, f"must be a whole number from {least}, got {raw!r}")
        return int(raw)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"]["minimum"] = self.LEAST[parameter["name"]]
        return parameters


def atomically(save):
    """Run `save` in one transaction; a lost race is a 409, never a 500 or half a change.
    The history names who did it (`models.PolicyHistory`): an operator's session as its
    user, a token as the change reason `token:<name>`."""
    try:
        with transaction.atomic():
            return save()
    except StaleVersion as error:
        raise conflict(f"{error}: read it again and reapply your change", "version") from None
    except IntegrityError as error:
        raise conflict(f"the change clashes with one made at the same time ({error}); try again") from None


def save_and_render(serializer) -> None:
    """Save, and render the answer (which reads the rows back) in the same transaction: a
    database lost after the commit could otherwise turn a saved change into a 503, and a
    retry into a 409. The serializer keeps what it rendered for the response."""

    def save():
        instance = serializer.save()
        # As DRF's update() does before it renders: rules read before the save are stale.
        if getattr(instance, "_prefetched_objects_cache", None):
            instance._prefetched_objects_cache = {}
        return serializer.data

    atomically(save)


class PolicyList(generics.ListCreateAPIView):
    permission_classes = [IsOperator]
    pagination_class = PolicyPagination
    lookup_field = "name"

    def perform_create(self, serializer):
        save_and_render(serializer)

    def get_success_headers(self, data):
        return {"Location": f"{self.request.path}/{quote(str(data[self.lookup_field]), safe='')}"}


class PolicyItem(generics.RetrieveUpdateDestroyAPIView):
    permission_classes = [IsOperator]
    lookup_field = "name"
    kind = "row"

    def get_object(self):
        value = self.kwargs[self.lookup_field]
        found = self.get_queryset().filter(**{self.lookup_field: value}).first()
        if found is None:
            raise not_found(f"no {self.kind} {value!r}", self.lookup_field)
        self.check_object_permissions(self.request, found)
        return found

    def perform_update(self, serializer):
        save_and_render(serializer)

    def perform_destroy(self, instance):
        try:
            check_deletable(instance)
        except PolicyViolation as error:
            raise conflict(error.reason, self.lookup_field) from None
        try:
            atomically(instance.delete)
        except ProtectedError as error:  # taken into use since the check above
            raise conflict(
                f"{self.kind} {instance} is still in use ({len(error.protected_objects)} rows); remove those uses first"
            ) from None


def _list_schema(kind: str, one: str, serializer, **more):
    return extend_schema_view(
        get=extend_schema(summary=f"List {kind}", tags=TAGS, responses={200: serializer, **schemas.ERRORS}, **more),
        post=extend_schema(
            summary=f"Create a {one}",
            tags=TAGS,
            responses={201: serializer, **WRITE_ERRORS},
            description="409 if one with that name already exists.",
        ),
    )


def _item_schema(kind: str, serializer):
    lock = " Send the `version` you read: 409 if it changed since, 400 without it."
    written = {200: serializer, **ITEM_ERRORS, **CONFLICT}
    return extend_schema_view(
        get=extend_schema(summary=f"Read a {kind}", tags=TAGS, responses={200: serializer, **ITEM_ERRORS}),
        put=extend_schema(
            summary=f"Replace a {kind}", tags=TAGS, responses=written, description=f"Every field is required.{lock}"
        ),
        patch=extend_schema(
            summary=f"Change some fields of a {kind}",
            tags=TAGS,
            responses=written,
            description=f"Only the fields sent change.{lock}",
        ),
        delete=extend_schema(
            summary=f"Delete a {kind}",
            tags=TAGS,
            responses={204: None, **ITEM_ERRORS, **CONFLICT},
            description="409 while something still uses it.",
        ),
    )


# Tiers ------------------------------------------------------------------------------------


@_list_schema("tiers", "tier", shapes.TierSerializer)
class TierList(PolicyList):
    serializer_class = shapes.TierSerializer
    queryset = Tier.objects.prefetch_related("rules__level")


@_item_schema("tier", shapes.TierSerializer)
class TierItem(PolicyItem):
    serializer_class = shapes.TierSerializer
    queryset = Tier.objects.prefetch_related("rules__level")
    kind = "tier"


# Tenants ----------------------------------------------------------------------------------

TIER_FILTER = OpenApiParameter("tier", str, description="Only the tenants of this tier.")


@_list_schema("tenants", "tenant", shapes.TenantSerializer, parameters=[TIER_FILTER])
class TenantList(PolicyList):
    serializer_class = shapes.TenantSerializer
    lookup_field = "key"

    def get_queryset(self):
        tenants = Tenant.objects.select_related("tier").prefetch_related("rules__level")
        tier = self.request.query_params.get("tier")
        return tenants.filter(tier__name=tier) if tier is not None else tenants


@_item_schema("tenant", shapes.TenantSerializer)
class TenantItem(PolicyItem):
    serializer_class = shapes.TenantSerializer
    queryset = Tenant.objects.select_related("tier").prefetch_related("rules__level")
    lookup_field = "key"
    kind = "tenant"


# Levels -----------------------------------------------------------------------------------


@_list_schema("levels", "level", shapes.LevelSerializer)
class LevelList(PolicyList):
    serializer_class = shapes.LevelSerializer
    queryset = Level.objects.all()


@_item_schema("level", shapes.LevelSerializer)
class LevelItem(PolicyItem):
    serializer_class = shapes.LevelSerializer
    queryset = Level.objects.all()
    kind = "level"


# Priority classes ------------------------------------------------------------------------------


@_list_schema("priority classes", "priority class", shapes.PrioritySerializer)
class PriorityList(PolicyList):
    serializer_class = shapes.PrioritySerializer
    queryset = PriorityClass.objects.prefetch_related("levels")


@_item_schema("priority class", shapes.PrioritySerializer)
class PriorityItem(PolicyItem):
    serializer_class = shapes.PrioritySerializer
    queryset = PriorityClass.objects.prefetch_related("levels")
    kind = "priority class"


# Alerts ---------------------------------------------------------------------------------------


@_list_schema("alerts", "alert", shapes.AlertSerializer)
class AlertList(PolicyList):
    serializer_class = shapes.AlertSerializer
    queryset = Alert.objects.all()


@_item_schema("alert", shapes.AlertSerializer)
class AlertItem(PolicyItem):
    serializer_class = shapes.AlertSerializer
    queryset = Alert.objects.all()
    kind = "alert"


# Settings -----------------------------------------------------------------------------------


SETTINGS_RESPONSES = {200: shapes.SettingsSerializer, **schemas.ERRORS}


@extend_schema_view(
    get=extend_schema(summary="Read the policy settings", tags=TAGS, responses=SETTINGS_RESPONSES),
    put=extend_schema(summary="Replace the policy settings", tags=TAGS, responses=SETTINGS_RESPONSES),
    patch=extend_schema(summary="Change some policy settings", tags=TAGS, responses=SETTINGS_RESPONSES),
)
class SettingsView(generics.RetrieveUpdateAPIView):
    """The store-wide settings: the default tier, for team keys that name no tenant."""

    permission_classes = [IsOperator]
    serializer_class = shapes.SettingsSerializer

    def get_object(self):
        # Reading must not write: the row is made by the first change.
        return PolicySettings.objects.filter(pk=1).select_related("default_tier").first() or PolicySettings()

    def perform_update(self, serializer):
        save_and_render(serializer)
