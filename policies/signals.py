"""Every committed policy change bumps the policy version, which workers poll to reload."""

from __future__ import annotations

from django.db import transaction
from django.db.models import F
from django.db.models.signals import m2m_changed, post_delete, post_save

from . import models

POLICY_MODELS = (models.Level, models.Tier, models.Tenant, models.Rule, models.PriorityClass, models.PolicySettings)


def bump_version() -> None:
    """Add one to the policy version (creating its row the first time)."""
    if not models.PolicyVersion.objects.filter(pk=1).update(number=F("number") + 1):
        models.PolicyVersion.objects.get_or_create(pk=1, defaults={"number": 1})


def current_version() -> int:
    """The policy version as committed; 0 before any change."""
    return models.PolicyVersion.objects.filter(pk=1).values_list("number", flat=True).first() or 0


def policy_changed(sender=None, using="default", **kwargs) -> None:
    """Bump the version inside the transaction that changes the policy, at its first change:
    the bump commits with the change or rolls back with it, once per transaction however
    many rows it changes (a policy load touches hundreds). A bump after the commit (an
    on_commit hook) would leave a saved change unpublished, and report it as failed, if the
    database went away between the commit and the bump: workers reload only when the
    version moves."""
    connection = transaction.get_connection(using)
    if not connection.in_atomic_block:
        bump_version()  # autocommit: the change is committed already
        return
    marker = getattr(connection, "_policies_bumped", None)
    # A rollback, of the transaction or of the savepoint that bumped, drops the marker from
    # run_on_commit together with the bump itself: the next change bumps again.
    if marker is not None and any(func is marker for _, func, _ in connection.run_on_commit):
        return
    bump_version()

    def committed() -> None:
        connection._policies_bumped = None

    connection._policies_bumped = committed
    transaction.on_commit(committed, using=using)


def connect() -> None:
    from simple_history.signals import pre_create_historical_record

    from .history import keep_rules

    for model in POLICY_MODELS:
        post_save.connect(policy_changed, sender=model, dispatch_uid=f"policies-save-{model.__name__}")
        post_delete.connect(policy_changed, sender=model, dispatch_uid=f"policies-delete-{model.__name__}")
    m2m_changed.connect(
        policy_changed, sender=models.PriorityClass.levels.through, dispatch_uid="policies-m2m-priority-levels"
    )
    for owner in (models.Tier, models.Tenant):
        # Each version of a tier or tenant in its history keeps the rules it had then.
        pre_create_historical_record.connect(
            keep_rules, sender=owner.history.model, dispatch_uid=f"policies-history-rules-{owner.__name__}"
        )
