"""The admin, on the console's own site: `django.contrib.admin` with LimiterAdminSite as
its default site, so `admin.site`, `@admin.register` and `admin.site.urls` all mean it."""

from django.contrib.admin.apps import AdminConfig


class LimiterAdminConfig(AdminConfig):
    default_site = "limiter_admin.admin_site.LimiterAdminSite"
