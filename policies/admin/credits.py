"""The ledger of credit top-ups (POST /api/v1/tenants/{key}/credits and the tenant page's
action), read-only: who added how much to which balance, and what was left after it."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from ..models import CreditTopUp


@admin.register(CreditTopUp)
class CreditTopUpAdmin(admin.ModelAdmin):
    list_display = ["at", "tenant", "level", "rule", "amount", "balance", "author"]
    list_filter = ["level"]
    search_fields = ["tenant_key", "rule", "by"]
    date_hierarchy = "at"

    def has_add_permission(self, request):
        return False  # a top-up goes through the service, which adds to the store too

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="tenant", ordering="tenant_key")
    def tenant(self, top_up):
        return format_html(
            '<a href="{}#tenant-quotas">{}</a>',
            reverse("admin:dashboard-tenant", args=[top_up.tenant_key]),
            top_up.tenant_key,
        )

    @admin.display(description="by", ordering="by")
    def author(self, top_up):
        return top_up.by or "(not recorded)"
