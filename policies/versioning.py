"""What every versioned policy row shares: its history (django-simple-history, naming who
made each change and the policy version it made) and its optimistic lock (`Versioned`).

Beside the models that use them (policies.models, policies.alerts), so that a module of
models of its own topic needs no import of another's.
"""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F
from django.dispatch import Signal
from simple_history.models import HistoricalRecords

from .invariants import taken


def history_user(request=None, **kwargs):
    """The operator whose session made a change; None for a caller that is no Django user."""
    user = getattr(request, "user", None)
    return user if isinstance(user, AbstractBaseUser) else None


class AtPolicyVersion(models.Model):
    """What every policy history record keeps beyond the row's own fields: the policy version
    its change made, so that a version (`PolicyChange`) lists the records it made."""

    policy_version = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        editable=False,
        db_index=True,
        help_text="The policy version this change made. Empty in records made before versions were logged.",
    )

    class Meta:
        abstract = True


class PolicyHistory(HistoricalRecords):
    """The audit trail of a policy model, naming who made each change. An operator's session
    is the history's user. A service token is no Django user (the API's `request.user` for
    it is a TokenUser), so its changes have no user and name it in the change reason
    instead: `token:<name>`, its str(). This covers every row a write touches (an owner's
    rules, a priority class's levels, deletions), not only the one the view saves."""

    def __init__(self, **kwargs):
        kwargs.setdefault("bases", [AtPolicyVersion])
        super().__init__(get_user=history_user, **kwargs)

    def get_change_reason_for_object(self, instance, history_type, using):
        reason = super().get_change_reason_for_object(instance, history_type, using)  # `_change_reason`
        if reason is None:
            user = getattr(getattr(self.context, "request", None), "user", None)
            if user is not None and user.is_authenticated and not isinstance(user, AbstractBaseUser):
                reason = str(user)[:100]  # the reason column holds 100 characters
        return reason


class StaleVersion(Exception):
    """A save of a row that someone else changed since it was read (optimistic locking)."""


# Sent by a versioned row's save before it writes anything (its version check is a write):
# the policy version is bumped there, so that every policy write locks the version row first.
versioned_save = Signal()


class Versioned(models.Model):
    """Optimistic locking: every save bumps `version`, and a save of a stale copy is refused."""

    version = models.PositiveIntegerField(default=1, editable=False)
    # Set before a save to give its history record a reason (django-simple-history reads it).
    _change_reason: str

    class Meta:
        abstract = True

    def save(self, *args, **kwargs):
        if not self._state.adding and self.pk is not None:
            versioned_save.send(sender=type(self), instance=self, using=kwargs.get("using") or "default")
            # A conditional UPDATE, so two saves of the same version cannot both win.
            stored = type(self)._default_manager.filter(pk=self.pk, version=self.version)
            bumped = stored.update(version=F("version") + 1)
            if not bumped:
                raise StaleVersion(f"{self._meta.verbose_name} {self} changed since you opened it")
            self.version += 1
        super().save(*args, **kwargs)

    def unique_error_message(self, model_class, unique_check):
        # One wording for a name taken, whoever asks: the admin's form, the API (a 409).
        if len(unique_check) == 1:
            value = getattr(self, unique_check[0])
            return ValidationError(taken(str(self._meta.verbose_name), value), code="unique")
        return super().unique_error_message(model_class, unique_check)
