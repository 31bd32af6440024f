"""What every versioned policy row's admin shares: a form that carries the version it was opened
at (a save over someone else's change is refused), history pages worded by `policies.changes`
with reverts that go through the same form, checks and lock as an edit, and deletions refused
while something relies on the row (`check_deletable`)."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.html import format_html
from simple_history.admin import SimpleHistoryAdmin

from ..changes import REVERT_PREFIX, Names, action_of, previous_records, record_changes, revert_reason
from ..history import revert_refusal
from ..integrity import check_deletable
from ..invariants import PolicyViolation
from ..models import PolicyChange, StaleVersion

STALE_MESSAGE = (
    "This {kind} changed since you opened it (someone else saved it, or a policy file was "
    "loaded). Your changes were not saved: reload the page to see the current version."
)


class VersionedForm(forms.ModelForm):
    """Carries the version the page was opened at, and refuses a save if it moved since."""

    # Not the model field itself: the admin refuses non-editable model fields on its forms.
    opened_version = forms.IntegerField(widget=forms.HiddenInput, required=False)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The row's version as stored, not the instance's: on a history page the instance
        # is an old copy, with the version it had then.
        self.stored_version = (
            type(self.instance).objects.filter(pk=self.instance.pk).values_list("version", flat=True).first()
            if self.instance.pk is not None
            else None
        )
        self.fields["opened_version"].initial = self.stored_version

    def clean(self):
        super().clean()
        data = self.cleaned_data
        opened_at = data.get("opened_version")
        if self.instance.pk is not None and opened_at != self.stored_version:
            raise ValidationError(STALE_MESSAGE.format(kind=self._meta.model._meta.verbose_name), code="stale")
        return data

    def save(self, commit=True):
        if self.instance.pk is not None:
            # The model's save refuses this version if anyone saved in between.
            self.instance.version = self.cleaned_data["opened_version"]
        return super().save(commit)


def refusing(found: tuple, check) -> tuple:
    """get_deleted_objects' answer (`found`), refused if `check` (a policy invariant) raises:
    its reason goes first among the protected objects, which stops the deletion and lists
    them on its page. That page shows missing delete permissions instead of protected
    objects when there are both, so those are left out then: the deletion is refused anyway."""
    deleted, counts, perms_needed, protected = found
    try:
        check()
    except PolicyViolation as error:
        return deleted, counts, set(), [str(error), *protected]
    return found


class PolicyAdmin(SimpleHistoryAdmin):
    """A save that lost the race to another one (after the form's own check passed) is
    rolled back and the page reloaded with the error, rather than ending in a 500. So is a
    revert on a history page, which also runs in one transaction, is refused with a message
    when it cannot be done (`revert_refusal`), and restores what the row's form does not
    hold (`reverted`)."""

    object_history_form_template = "admin/policies/history_form.html"
    object_history_template = "admin/policies/object_history.html"
    object_history_list_template = "admin/policies/object_history_list.html"

    def set_history_delta_changes(self, request, historical_records, foreign_keys_are_objs=True):
        """Each record's changes as `policies.changes` words them: field diffs without the
        version counter, related rows by name, and a tier's or tenant's rules diffed too; what
        it did (a revert says so), and who made it: the operator, else the author its policy
        version names (`token:<name>`, `loadpolicies demo.yaml`)."""
        records = list(historical_records)
        names = Names()
        previous = previous_records(records)
        versions = {record.policy_version for record in records if record.policy_version}
        authors = dict(PolicyChange.objects.filter(version__in=versions).values_list("version", "by"))
        for record in records:
            record.changes = record_changes(record, previous.get(record.history_id), names)
            record.action = action_of(record)
            record.author = record.history_user or authors.get(record.policy_version) or ""
            reason = record.history_change_reason or ""
            record.reason = "" if reason == str(record.author) else reason  # a token: its name, said once

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except StaleVersion:
            self.message_user(request, STALE_MESSAGE.format(kind=self.model._meta.verbose_name), messages.ERROR)
            return HttpResponseRedirect(request.path)

    def history_form_view(self, request, object_id, version_id, extra_context=None):
        record = self.history_record(object_id, version_id)
        if request.method == "POST" and not self.has_change_history_permission(request, record.instance):
            raise PermissionDenied
        refusal = revert_refusal(record)
        if refusal and request.method == "POST":
            self.message_user(request, refusal, messages.ERROR)
            return HttpResponseRedirect(request.path)
        context = {"revert_record": record, "revert_refusal": refusal, **self.revert_context(record)}
        if refusal:
            context["revert_disabled"] = True  # no Revert button
        context.update(extra_context or {})
        if request.method == "POST":
            request.reverting_to = record  # read by save_model and response_change
        try:
            with transaction.atomic():
                response = super().history_form_view(request, object_id, version_id, context)
                if request.method == "POST" and response.status_code == 302:  # the form saved the row
                    self.reverted(request, self.model.objects.get(pk=record.instance.pk), record)
                return response
        except StaleVersion:
            self.message_user(request, STALE_MESSAGE.format(kind=self.model._meta.verbose_name), messages.ERROR)
            return HttpResponseRedirect(request.path)

    def save_model(self, request, obj, form, change):
        record = getattr(request, "reverting_to", None)
        if record is not None:
            obj._change_reason = revert_reason(record)  # the record this save makes says it reverted
        super().save_model(request, obj, form, change)

    def response_change(self, request, obj):
        """After a revert: say what was put back, and stay on the row (its change page)."""
        record = getattr(request, "reverting_to", None)
        if record is None:
            return super().response_change(request, obj)
        opts = self.model._meta
        url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[quote(obj.pk)])
        when = revert_reason(record).removeprefix(REVERT_PREFIX)
        self.message_user(
            request,
            format_html("Reverted the {} “{}” to its version of {}.", opts.verbose_name, obj, when),
            messages.SUCCESS,
        )
        return HttpResponseRedirect(url)

    def history_record(self, object_id, version_id):
        """The history record `version_id` of the row `object_id`, or a 404."""
        history = getattr(self.model, self.model._meta.simple_history_manager_attribute).model
        return get_object_or_404(history, **{self.model._meta.pk.attname: unquote(object_id), "history_id": version_id})

    def render_history_view(self, request, template, context, **kwargs):
        if "revert_record" in context and not context["adminform"].form.is_bound:
            context["adminform"].form.initial.update(self.revert_initial(context["revert_record"]))
        return super().render_history_view(request, template, context, **kwargs)

    def revert_context(self, record) -> dict:
        """What a history page shows beyond the row's form."""
        return {}

    def revert_initial(self, record) -> dict:
        """The form's values at `record` that the record's own fields do not give."""
        return {}

    def reverted(self, request, obj, record) -> None:
        """After the form reverted `obj`'s fields to `record`, in the same transaction."""


class VersionedAdmin(PolicyAdmin):
    """A row that something still relies on is not deleted (`check_deletable`)."""

    def get_deleted_objects(self, objs, request):
        def each_deletable() -> None:
            for row in objs:
                check_deletable(row)

        return refusing(super().get_deleted_objects(objs, request), each_deletable)
