"""/api/v1/...: the gateways' endpoints and the operators' read-outs and policy CRUD."""

from django.urls import path, register_converter

from . import alerts, authz, crud, decisions, inspection, quotas, rls, whatif


class AnyRest:
    """The rest of a path, whatever it holds: Django's <path:> stops at a newline (a %0A in
    the request's URL), and forward-auth answers any path below it the same."""

    regex = r"[\s\S]+"  # any character, a newline included (in ECMA regexes too, for the schema)

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(AnyRest, "rest")

urlpatterns = [
    path("decisions", decisions.DecisionView.as_view(), name="api-decisions"),
    path("decisions/batch", decisions.BatchView.as_view(), name="api-decisions-batch"),
    # envoyproxy/ratelimit's JSON contract (docs/GATEWAYS.md).
    path("rls/json", rls.RlsJsonView.as_view(), name="api-rls-json"),
    path("leases/<str:lease>/release", decisions.LeaseReleaseView.as_view(), name="api-lease-release"),
    # Forward-auth: gateways may append the request's path; any path below answers the same.
    path("authz", authz.AuthzView.as_view(), name="api-authz"),
    path("authz/<rest:rest>", authz.AuthzView.as_view(schema=authz.BELOW), name="api-authz-below"),
    path("reservations", decisions.ReservationView.as_view(), name="api-reservations"),
    path("reservations/<str:reservation_id>/commit", decisions.CommitView.as_view(), name="api-reservation-commit"),
    path("reservations/<str:reservation_id>/cancel", decisions.CancelView.as_view(), name="api-reservation-cancel"),
    path("buckets", inspection.BucketsView.as_view(), name="api-buckets"),
    path("stats/blocked", inspection.BlockedStatsView.as_view(), name="api-stats-blocked"),
    path("whatif", whatif.WhatIfView.as_view(), name="api-whatif"),
    path("tiers", crud.TierList.as_view(), name="api-tiers"),
    path("tiers/<str:name>", crud.TierItem.as_view(), name="api-tier"),
    # Team keys are the gateway's strings, so a tenant's may hold a slash.
    path("tenants", crud.TenantList.as_view(), name="api-tenants"),
    # Before the tenant's own route, whose <path:key> would take "acme/usage" whole.
    path("tenants/<path:key>/usage", inspection.TenantUsageView.as_view(), name="api-tenant-usage"),
    path("tenants/<path:key>/quotas", quotas.TenantQuotasView.as_view(), name="api-tenant-quotas"),
    path("tenants/<path:key>/credits", quotas.TenantCreditsView.as_view(), name="api-tenant-credits"),
    path("tenants/<path:key>", crud.TenantItem.as_view(), name="api-tenant"),
    path("levels", crud.LevelList.as_view(), name="api-levels"),
    path("levels/<str:name>", crud.LevelItem.as_view(), name="api-level"),
    path("priorities", crud.PriorityList.as_view(), name="api-priorities"),
    path("priorities/<str:name>", crud.PriorityItem.as_view(), name="api-priority"),
    path("settings", crud.SettingsView.as_view(), name="api-settings"),
    path("alerts", crud.AlertList.as_view(), name="api-alerts"),
    path("alerts/<str:name>", crud.AlertItem.as_view(), name="api-alert"),
    path("alerts/<str:name>/deliveries", alerts.AlertDeliveriesView.as_view(), name="api-alert-deliveries"),
    path("alerts/<str:name>/test", alerts.AlertTestView.as_view(), name="api-alert-test"),
]
