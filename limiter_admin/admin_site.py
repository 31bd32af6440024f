"""The operators' admin site: Django's admin plus the console at /admin/dashboard/
(limiter_admin.console: the dashboard and the tenant pages).

The dashboard's pages are the admin's own: URLs prepended in get_urls(), each wrapped in
`admin_view` (staff only; anyone else goes to the login page), and templates extending
admin/base_site.html with `each_context`.
"""

from django.contrib import admin
from django.urls import path

from limiter_admin.login_limit import login_refusal


class LimiterAdminSite(admin.AdminSite):
    site_header = "Limiter Admin"
    site_title = "Limiter Admin"
    index_title = "Policies and operations"

    def login(self, request, extra_context=None):
        """The admin's login, with a limit on posts per client address (login_limit.py)."""
        return login_refusal(request) or super().login(request, extra_context)

    def index(self, request, extra_context=None):
        """The index, its recent actions read as sentences (`limiter_admin.actions`)."""
        # Here, not at the top: the admin site is made while the app registry loads (the
        # admin app's default_site), before any module that imports models may be imported.
        from limiter_admin.actions import recent_actions

        context = {"recent_actions": recent_actions(request.user), **(extra_context or {})}
        return super().index(request, context)

    def get_urls(self):
        # Here, not at the top: as in index(), these import models.
        from limiter_admin.console.views import DashboardViews, TenantViews

        views = DashboardViews(self)
        tenants = TenantViews(self)
        wrap = self.admin_view
        return [
            path("dashboard/", wrap(views.page), name="dashboard"),
            path("dashboard/throttled/", wrap(views.throttled), name="dashboard-throttled"),
            path("dashboard/buckets/", wrap(views.buckets), name="dashboard-buckets"),
            path("dashboard/dry-run/", wrap(views.dry_run), name="dashboard-dry-run"),
            path("dashboard/health/", wrap(views.health), name="dashboard-health"),
            path("dashboard/reset/", wrap(views.reset), name="dashboard-reset"),
            path("dashboard/search/", wrap(views.search), name="dashboard-search"),
            path("dashboard/raise-limit/", wrap(tenants.raise_limit), name="dashboard-raise-limit"),
            path("dashboard/credits/", wrap(tenants.credits), name="dashboard-credits"),
            # Team keys are the gateway's strings, so a tenant's may hold a slash.
            path("dashboard/tenants/<path:key>/", wrap(tenants.page), name="dashboard-tenant"),
        ] + super().get_urls()
