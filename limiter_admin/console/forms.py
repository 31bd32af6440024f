"""What an operator asks the console for: a key to look at, a dry run of a request for it,
and a quick raise of one of a tenant's limits."""

from __future__ import annotations

from urllib.parse import urlencode

from django import forms

from core import InvalidRequest
from core.params import LARGEST_NUMBER
from policies.overrides import MAX_FACTOR, MAX_HOURS
from policies.policy import TENANT_LEVEL
from policies.services.errors import ServiceError
from policies.services.inputs import MAX_KEY_LENGTH


class BucketQuery(forms.Form):
    """A key to look at: its level, the key, and for user keys the team whose tier applies."""

    level = forms.ChoiceField()
    # Not stripped: a key is the gateway's exact string.
    key = forms.CharField(max_length=MAX_KEY_LENGTH, strip=False)
    team = forms.CharField(max_length=MAX_KEY_LENGTH, strip=False, required=False)

    def __init__(self, data, policy, initial=None):
        super().__init__(data, initial=initial or {"level": TENANT_LEVEL})
        # A ChoiceField; Form.fields types each field as Field.
        self.fields["level"].choices = [(level, level) for level in policy.levels]  # type: ignore[attr-defined]

    @property
    def team_key(self) -> str | None:
        """The team key that picks the tenant and tier, as bucket_report reads it."""
        data = self.cleaned_data
        return data["key"] if data["level"] == TENANT_LEVEL else (data.get("team") or None)

    def query(self) -> str:
        data = self.cleaned_data
        return urlencode({"level": data["level"], "key": data["key"], "team": data.get("team") or ""})

    def add_api_error(self, error: ServiceError | InvalidRequest) -> None:
        """An error of the services' checks, shown on the field it names."""
        fields = error.fields if isinstance(error, ServiceError) else {error.field: error.reason}
        for name, message in fields.items():
            name = "key" if name.startswith("keys.") else name
            self.add_error(name if name in self.fields else None, message)


class DryRunQuery(BucketQuery):
    """A key, and the request to try on it: its cost and priority class."""

    cost = forms.FloatField(initial=1)
    priority = forms.ChoiceField(required=False)

    def __init__(self, data, policy, initial=None):
        super().__init__(data, policy, initial)
        # A ChoiceField; Form.fields types each field as Field.
        self.fields["priority"].choices = [("", "none")] + [  # type: ignore[attr-defined]
            (name, name) for name in sorted(policy.priorities)
        ]

    def clean_cost(self):
        cost = self.cleaned_data["cost"]
        if not 0 < cost <= LARGEST_NUMBER:
            raise forms.ValidationError(f"must be more than 0 and at most {LARGEST_NUMBER:.0e}")
        return cost


class CreditsForm(forms.Form):
    """A top-up of a tenant's credits: the quota (its index at the level) and how much."""

    key = forms.CharField(max_length=MAX_KEY_LENGTH, strip=False)
    level = forms.CharField(max_length=64)
    position = forms.IntegerField(min_value=0)
    add = forms.FloatField(min_value=0)

    def clean_add(self):
        add = self.cleaned_data["add"]
        if not 0 < add <= LARGEST_NUMBER:
            raise forms.ValidationError(f"must be more than 0 and at most {LARGEST_NUMBER:.0e}")
        return add


class RaiseForm(forms.Form):
    """A quick raise: one rule at one level, by a factor, for some hours; `version` is the
    tenant's when the page was shown (0: no tenant row yet)."""

    key = forms.CharField(max_length=MAX_KEY_LENGTH, strip=False)
    level = forms.CharField(max_length=64)
    rule = forms.CharField(max_length=500, strip=False)
    factor = forms.FloatField(min_value=1.0, max_value=MAX_FACTOR)
    hours = forms.IntegerField(min_value=1, max_value=MAX_HOURS)
    version = forms.IntegerField(min_value=0)

    def clean_factor(self):
        factor = self.cleaned_data["factor"]
        if factor <= 1:
            raise forms.ValidationError("must be more than 1")
        return factor
