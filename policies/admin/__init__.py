"""The operators' console for the policy store.

Rule types, their parameters and help texts come from core.RULES; nothing about a rule
type is written here: a rule's form (`policies.admin.rule_form`) has a typed field per parameter,
built from its type's declarations, and JSON for plug-in types. Tiers, tenants, levels and
priority classes carry a hidden version: a save of a page that someone changed since it was
opened is refused, never silently applied over their change.
Every model keeps its history (django-simple-history), shown by each page's History link;
reverting to a version goes through the same form, checks and lock as an edit, and puts a
tier's or tenant's rules back too (`policies.history`). History pages and the policy versions
list word each change as `policies.changes` does (a tier's rules diffed field by field). The
policy's invariants are checked by `policies.invariants`, as the API and the policy file
check them: this module only shows their refusals. What every versioned row's admin shares
(the version on the form, history pages and reverts, deletions refused while in use) is in
`policies.admin.versioned`; the alerts' pages are `policies.admin.alerts`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.contrib.admin.widgets import RelatedFieldWidgetWrapper
from django.core.exceptions import ValidationError
from django.db.models import Exists, OuterRef, Q
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from ..changes import Names, described, sentence, summary, version_records
from ..history import put_back_rules, record_rules
from ..integrity import check_owner, check_rule_rows
from ..invariants import PolicyViolation
from ..models import (
    Level,
    PolicyChange,
    PolicySettings,
    PolicyVersion,
    PriorityClass,
    Rule,
    ServiceToken,
    Tenant,
    Tier,
)

# Alerts have a module of their own: their page, its delivery log and its test send.
from . import (
    alerts,  # noqa: F401  (registers AlertAdmin)
    credits,  # noqa: F401  (registers CreditTopUpAdmin)
)
from .rule_form import RuleForm
from .versioned import PolicyAdmin, VersionedAdmin, VersionedForm, refusing
from .whatif import PreviewImpact


class RuleFormSet(forms.BaseInlineFormSet):
    """The rules of one tier or tenant, checked together with the global rules."""

    def rule_specs(self) -> dict[str, list[dict]]:
        """The rules the formset holds (once valid), as specs by level name."""
        rules: dict[str, list[dict]] = {}
        for form in self.forms:
            data = form.cleaned_data
            if data and not data.get("DELETE"):
                rule = Rule(**{k: data[k] for k in RuleForm.Meta.fields})
                rules.setdefault(data["level"].name, []).append(rule.spec())
        return rules

    def clean(self):
        super().clean()
        if any(self.errors):
            return
        rules = self.rule_specs()
        try:
            check_owner("tier" if isinstance(self.instance, Tier) else "tenant", rules)
        except PolicyViolation as error:
            raise ValidationError(str(error)) from None


class RulePageForm(RuleForm):
    """A rule edited on its own page: with it, its owner (before and after) and, for a global
    rule, every tier and tenant keep the policy's invariants."""

    def clean(self):
        super().clean()
        data = self.cleaned_data
        if self.errors or (data.get("tier") and data.get("tenant")):
            return data  # the field's own error, or the model's (never both owners)
        candidate = Rule(pk=self.instance.pk, **{k: data.get(k) for k in ["tier", "tenant", *RuleForm.Meta.fields]})
        try:
            check_rule_rows(save=candidate)
        except PolicyViolation as error:
            raise ValidationError(str(error)) from None
        return data


class RuleInline(admin.TabularInline):
    """A tier's or tenant's rules, one row each: the parameters cell shows the typed fields of
    the rule type picked (`policies.admin.rule_form`)."""

    model = Rule
    form = RuleForm
    formset = RuleFormSet
    extra = 0
    fields = ["level", "type", "params", "label", "shadow", "counts", "position"]

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        widget = getattr(field, "widget", None)
        if isinstance(widget, RelatedFieldWidgetWrapper):
            # No add, change or delete a level from a rule's row: levels have their own page,
            # and the four buttons would widen every row of the table.
            widget.can_add_related = widget.can_change_related = False
            widget.can_delete_related = widget.can_view_related = False
        return field


class TierRuleInline(RuleInline):
    fk_name = "tier"
    verbose_name_plural = "rules (at least one)"


class TenantRuleInline(RuleInline):
    fk_name = "tenant"
    verbose_name = "override"
    verbose_name_plural = "overrides: these replace the tier's rules at their level until the expiry"


class TierForm(VersionedForm):
    class Meta:
        model = Tier
        fields = ["name"]


class TenantForm(VersionedForm):
    class Meta:
        model = Tenant
        fields = ["key", "tier", "overrides_until"]


class LevelForm(VersionedForm):
    class Meta:
        model = Level
        fields = ["name", "position", "fail_mode", "fallback_fraction"]


class PriorityClassForm(VersionedForm):
    class Meta:
        model = PriorityClass
        fields = ["name", "watermark", "levels"]


class RuleOwnerAdmin(VersionedAdmin):
    """A tier or tenant, its rules inline. Its history records keep its rules, and reverting
    to one puts them back."""

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        record_rules(form.instance)  # the record the save made holds the rules saved after it

    def revert_context(self, record) -> dict:
        if record.rules is None:
            return {}
        levels = dict(Level.objects.values_list("pk", "name"))
        rows = []
        for row in record.rules:
            fields = {name: row[name] for name in ("type", "params", "label", "shadow", "counts")}
            rows.append((levels.get(row["level"], f"#{row['level']} (deleted)"), json.dumps(Rule(**fields).spec())))
        return {"revert_rules": rows, "revert_rules_owner": record.instance_type._meta.verbose_name}

    def reverted(self, request, obj, record) -> None:
        put_back_rules(obj, record)


class HasOverridesFilter(admin.SimpleListFilter):
    title = "overrides"
    parameter_name = "overrides"

    def lookups(self, request, model_admin):
        return [("active", "active now"), ("yes", "has overrides"), ("no", "no overrides")]

    def queryset(self, request, queryset):
        has = Exists(Rule.objects.filter(tenant=OuterRef("pk")))
        if self.value() == "yes":
            return queryset.filter(has)
        if self.value() == "no":
            return queryset.exclude(has)
        if self.value() == "active":
            return queryset.filter(has).filter(Q(overrides_until__isnull=True) | Q(overrides_until__gt=timezone.now()))
        return queryset


@admin.register(Level)
class LevelAdmin(VersionedAdmin):
    # Not list_editable: the change list carries no version per row, so a list opened before
    # someone's change would silently write its old values back over it. Levels are few.
    form = LevelForm
    list_display = ["name", "position", "fail_mode", "fallback_fraction", "version"]


@admin.register(Tier)
# PolicyAdmin names its history template by a string, which django-stubs' ModelAdmin (a base of
# PreviewImpact too) types more widely: the two bases agree at run time.
class TierAdmin(PreviewImpact, RuleOwnerAdmin):  # type: ignore[misc]
    form = TierForm
    inlines = [TierRuleInline]
    list_display = ["name", "rule_count", "tenant_count", "version"]
    search_fields = ["name"]

    @admin.display(description="rules")
    def rule_count(self, tier):
        return tier.rules.count()

    @admin.display(description="tenants")
    def tenant_count(self, tier):
        return tier.tenants.count()


@admin.register(Tenant)
# PolicyAdmin names its history template by a string, which django-stubs' ModelAdmin (a base of
# PreviewImpact too) types more widely: the two bases agree at run time.
class TenantAdmin(PreviewImpact, RuleOwnerAdmin):  # type: ignore[misc]
    form = TenantForm
    inlines = [TenantRuleInline]
    list_display = ["key", "tier", "overrides_until", "has_overrides"]
    list_filter = ["tier", HasOverridesFilter]
    search_fields = ["key"]
    list_select_related = ["tier"]

    @admin.display(boolean=True, description="overrides")
    def has_overrides(self, tenant):
        return tenant.rules.exists()


@admin.register(Rule)
class RuleAdmin(PolicyAdmin):
    """Every rule; global rules (no tier, no tenant) are edited here."""

    form = RulePageForm
    fields = ["tier", "tenant", "level", "type", "params", "label", "shadow", "counts", "position"]
    list_display = ["type", "owner_name", "level", "params", "label", "shadow", "counts"]
    list_filter = ["level", "type", "tier"]
    search_fields = ["tenant__key", "tier__name", "label"]
    list_select_related = ["tier", "tenant", "level"]

    def get_form(self, request, obj=None, **kwargs):
        kwargs["fields"] = self.fields
        return super().get_form(request, obj, **kwargs)

    def save_model(self, request, obj, form, change):
        before = Rule.objects.filter(pk=obj.pk).values("tier_id", "tenant_id").first() if change else None
        super().save_model(request, obj, form, change)
        _bump_owners(obj, before)

    def delete_model(self, request, obj):
        super().delete_model(request, obj)
        _bump_owners(obj, None)

    def delete_queryset(self, request, queryset):
        rules = list(queryset)
        super().delete_queryset(request, queryset)
        for rule in rules:
            _bump_owners(rule, None)

    def get_deleted_objects(self, objs, request):
        # The rules go together, so they are checked together.
        return refusing(super().get_deleted_objects(objs, request), lambda: check_rule_rows(delete=objs))

    @admin.display(description="owner")
    def owner_name(self, rule):
        return (
            format_html("tier {}", rule.tier)
            if rule.tier
            else format_html("tenant {}", rule.tenant)
            if rule.tenant
            else "global"
        )


def _bump_owners(rule: Rule, before: Mapping[str, Any] | None) -> None:
    """A rule edited on its own page changes its tier's or tenant's rules: save them after
    it, so that a tier or tenant page opened before refuses to save over it (a new version),
    and their history has a record with these rules."""
    tiers = {pk for pk in (rule.tier_id, (before or {}).get("tier_id")) if pk is not None}
    tenants = {pk for pk in (rule.tenant_id, (before or {}).get("tenant_id")) if pk is not None}
    for owner in [*Tier.objects.filter(pk__in=tiers), *Tenant.objects.filter(pk__in=tenants)]:
        owner.save()


@admin.register(PriorityClass)
class PriorityClassAdmin(VersionedAdmin):
    form = PriorityClassForm
    list_display = ["name", "watermark", "level_names", "version"]
    filter_horizontal = ["levels"]

    def revert_initial(self, record) -> dict:
        # The form would show the levels it has now: the record keeps those it had then.
        return {"levels": [row.level_id for row in record.levels.all()]}

    @admin.display(description="levels")
    def level_names(self, priority):
        return ", ".join(level.name for level in priority.levels.all()) or "global (default)"


@admin.register(PolicySettings)
class PolicySettingsAdmin(PolicyAdmin):
    list_display = ["__str__", "default_tier"]

    def has_add_permission(self, request):
        return not PolicySettings.objects.exists()

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(PolicyVersion)
class PolicyVersionAdmin(ReadOnlyAdmin):
    """Read-only: the number workers poll to notice a change. Not on the index: the policy
    versions list (PolicyChange) shows each version with its author and changes."""

    list_display = ["number", "versions"]

    def get_model_perms(self, request):
        return {}  # left off the index, still served

    @admin.display(description="each version")
    def versions(self, counter):
        return format_html('<a href="{}">policy versions</a>', reverse("admin:policies_policychange_changelist"))


class VersionChangeList(ChangeList):
    """The page's versions with what each changed, read for the whole page at once."""

    def get_results(self, request):
        super().get_results(request)
        records = version_records(row.version for row in self.result_list)
        names = Names()
        for row in self.result_list:
            row.summary = summary(records.get(row.version, []), names)


@admin.register(PolicyChange)
class PolicyChangeAdmin(ReadOnlyAdmin):
    """Each policy version: when, who, and what it changed (its history records, worded by
    `policies.changes`); a version's page lists every change, each linked to its record."""

    list_display = ["version", "at", "author", "what_changed"]

    class Media:
        css = {"all": ["policies/history.css"]}

    list_display_links = ["version"]
    list_filter = ["by"]
    date_hierarchy = "at"
    fields = ["version", "at", "author", "changes"]
    readonly_fields = ["version", "at", "author", "changes"]

    def get_changelist(self, request, **kwargs):
        return VersionChangeList

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("user")

    @admin.display(description="by", ordering="by")
    def author(self, change):
        return change.by or "(not recorded)"

    @admin.display(description="what changed")
    def what_changed(self, change):
        lines = getattr(change, "summary", None) or ["(no history records: made before versions were logged)"]
        return format_html_join("", '<div class="version-summary">{}</div>', ((line,) for line in lines))

    @admin.display(description="changes")
    def changes(self, change):
        records = version_records([change.version])[change.version]
        if not records:
            return "No history records carry this version (it was made before versions were logged)."
        names = Names()
        return format_html(
            '<ul class="version-changes">{}</ul>',
            format_html_join(
                "",
                '<li><a href="{}">{}</a></li>',
                (
                    (_record_url(record), sentence(record, found, names, most=50))
                    for record, found in described(records, names)
                ),
            ),
        )


def _record_url(record) -> str:
    """The history page of the version `record` of its row."""
    opts = record.instance_type._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_simple_history", args=[record.id, record.history_id])


@admin.register(ServiceToken)
class ServiceTokenAdmin(admin.ModelAdmin):
    """Lists and revokes the API's service tokens. Tokens are made by `manage.py
    createservicetoken`, which prints the token once: the admin cannot make one, since it
    would have to carry the secret through a page or a message. The digest is never shown."""

    list_display = ["name", "scope", "prefix", "created_at", "revoked_at"]
    list_filter = ["scope", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix"]
    fields = ["name", "scope", "prefix", "created_at", "revoked_at"]
    actions = ["revoke"]

    def get_readonly_fields(self, request, obj=None):
        # Scope is fixed at creation (widening it would hand a gateway's token admin rights),
        # and a revoked token stays revoked: make a new one instead.
        fixed = ["scope", "prefix", "created_at"]
        return fixed + ["revoked_at"] if obj is not None and obj.revoked else fixed

    def has_add_permission(self, request):
        return False

    def changelist_view(self, request, extra_context=None):
        extra_context = {
            "title": "Service tokens (make one with: manage.py createservicetoken NAME --scope decide|admin)",
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra_context)

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke(self, request, queryset):
        now = timezone.now()
        tokens = list(queryset.filter(revoked_at__isnull=True))
        for token in tokens:
            token.revoked_at = now
            # One save each, not an update(): post_save empties this process's token cache.
            token.save(update_fields=["revoked_at"])
        self.message_user(
            request, f"Revoked {len(tokens)} token(s): they stop working within seconds.", messages.SUCCESS
        )
