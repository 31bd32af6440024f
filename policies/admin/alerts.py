"""The console's alerts: list and edit them, read each one's delivery log, and send a test.

An alert's page is a policy row's (versioned, with its history, checked by the Alert row's
invariants, each refusal on its field). The secret is a password field that never shows what
is stored: left empty it keeps the stored secret. "Send a test" posts to `<object_id>/test/`
(get_urls, behind admin_view), which sends a test delivery now on the deliveries' pool
(policies.services.alerts) and comes back to the page with how it went; the delivery log
under the form lists the latest attempts, tests and firings alike.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from ..invariants import MAX_SECRET
from ..models import Alert, AlertDelivery
from ..services.alerts import send_test
from ..services.errors import Busy
from .versioned import VersionedAdmin, VersionedForm

LOG_ROWS = 25  # the latest attempts shown on the page (GET /api/v1/alerts/{name}/deliveries has them all)


class AlertForm(VersionedForm):
    secret = forms.CharField(
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        required=False,
        max_length=MAX_SECRET,
        strip=False,
        help_text="Deliveries are signed with it (HMAC-SHA256, X-Limiter-Signature). Never shown: "
        "leave it empty to keep the one stored.",
    )

    class Meta:
        model = Alert
        fields = ["name", "kind", "threshold", "window", "url", "secret", "format", "enabled"]
        widgets = {"url": forms.URLInput(attrs={"size": 60}), "window": forms.TextInput(attrs={"size": 8})}

    def clean_secret(self):
        # Empty keeps the stored secret (a history page's copy of the row has none of its own).
        given = self.cleaned_data.get("secret")
        if given:
            return given
        stored = Alert.objects.filter(pk=self.instance.pk).values_list("secret", flat=True).first()
        return stored or ""


@admin.register(Alert)
class AlertAdmin(VersionedAdmin):
    form = AlertForm
    change_form_template = "admin/policies/alert_change_form.html"
    list_display = ["name", "kind", "share", "window", "receiver", "enabled", "last_delivery"]
    list_filter = ["kind", "enabled"]
    search_fields = ["name", "url"]
    readonly_fields = ["delivery_log"]
    fieldsets = [
        (None, {"fields": ["name", "kind", "threshold", "window", "url", "secret", "format", "enabled"]}),
        ("Delivery log", {"fields": ["delivery_log"]}),
    ]

    class Media:
        css = {"all": ["policies/alerts.css"]}

    def get_fieldsets(self, request, obj=None):
        # A new alert has no log yet.
        return self.fieldsets if obj is not None else self.fieldsets[:1]

    def get_urls(self):
        opts = self.model._meta
        test = path(
            "<path:object_id>/test/",
            self.admin_site.admin_view(self.send_test_view),
            name=f"{opts.app_label}_{opts.model_name}_test",
        )
        return [test, *super().get_urls()]

    def send_test_view(self, request, object_id):
        alert = self.get_object(request, unquote(object_id))
        if alert is None:
            raise Http404(f"no alert {object_id!r}")
        page = reverse("admin:policies_alert_change", args=[quote(alert.pk)], current_app=self.admin_site.name)
        if request.method != "POST":
            return HttpResponseRedirect(page)
        if not self.has_change_permission(request, alert):
            raise PermissionDenied
        try:
            delivery = send_test(alert)
        except Busy as busy:
            self.message_user(request, f"Busy: {busy.reason}.", messages.ERROR)
            return HttpResponseRedirect(page)
        if delivery.ok:
            self.message_user(
                request,
                f"Test delivered: {alert.url} answered {delivery.status} in {delivery.duration:.2f} s.",
                messages.SUCCESS,
            )
        else:
            self.message_user(request, f"Test not delivered: {delivery.error}.", messages.ERROR)
        return HttpResponseRedirect(page)

    @admin.display(description="threshold", ordering="threshold")
    def share(self, alert):
        return f"{alert.threshold:.0%}" if alert.threshold * 100 == round(alert.threshold * 100) else alert.threshold

    @admin.display(description="receiver", ordering="url")
    def receiver(self, alert):
        return urlsplit(alert.url).netloc or alert.url

    @admin.display(description="last delivery")
    def last_delivery(self, alert):
        latest = alert.deliveries.order_by("-at", "-id").first()
        if latest is None:
            return "—"
        return format_html(
            '<span class="{}">{}</span> {}',
            "delivery-ok" if latest.ok else "delivery-failed",
            outcome(latest),
            f"{latest.at:%Y-%m-%d %H:%M:%S} UTC",
        )

    @admin.display(description="latest attempts")
    def delivery_log(self, alert):
        rows = list(alert.deliveries.select_related("firing").order_by("-at", "-id")[:LOG_ROWS])
        if not rows:
            return "No deliveries yet: send a test (above) to try the receiver."
        header = format_html_join("", "<th scope='col'>{}</th>", ((h,) for h in LOG_COLUMNS))
        body = format_html_join(
            "",
            "<tr class='{}'><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    "delivery-ok" if row.ok else "delivery-failed",
                    f"{row.at:%Y-%m-%d %H:%M:%S}",
                    fired(row),
                    row.attempt,
                    outcome(row),
                    row.error or "",
                    f"{row.duration * 1000:.0f} ms",
                )
                for row in rows
            ),
        )
        return format_html(
            '<div class="delivery-log"><table><thead><tr>{}</tr></thead><tbody>{}</tbody></table></div>', header, body
        )


LOG_COLUMNS = ("time (UTC)", "what", "attempt", "result", "error", "took")


def outcome(delivery: AlertDelivery) -> str:
    if delivery.ok:
        return f"delivered ({delivery.status})"
    return f"failed ({delivery.status})" if delivery.status is not None else "failed (no answer)"


def fired(delivery: AlertDelivery) -> str:
    firing = delivery.firing
    if firing is None:
        return "test"
    if firing.rule:
        return f"{firing.tenant}: {firing.level}: {firing.rule} at {firing.value:.0%}"
    return f"{firing.tenant}: {firing.value:.0%} denied"
