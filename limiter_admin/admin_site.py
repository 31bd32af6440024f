"""The operators' admin site: Django's admin plus the dashboard at /admin/dashboard/.

The dashboard's pages are the admin's own: URLs prepended in get_urls(), each wrapped in
`admin_view` (staff only; anyone else goes to the login page), and templates extending
admin/base_site.html with `each_context`.
"""

from django.contrib import admin
from django.urls import path


class LimiterAdminSite(admin.AdminSite):
    site_header = "Limiter Admin"
    site_title = "Limiter Admin"
    index_title = "Policies and operations"

    def get_urls(self):
        from limiter_admin import dashboard

        views = dashboard.DashboardViews(self)
        wrap = self.admin_view
        return [
            path("dashboard/", wrap(views.page), name="dashboard"),
            path("dashboard/throttled/", wrap(views.throttled), name="dashboard-throttled"),
            path("dashboard/buckets/", wrap(views.buckets), name="dashboard-buckets"),
            path("dashboard/dry-run/", wrap(views.dry_run), name="dashboard-dry-run"),
            path("dashboard/health/", wrap(views.health), name="dashboard-health"),
            path("dashboard/reset/", wrap(views.reset), name="dashboard-reset"),
        ] + super().get_urls()
