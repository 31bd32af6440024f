"""Every committed policy change bumps the policy version, which workers poll to reload."""

from __future__ import annotations

import secrets
from functools import partial

from asgiref.local import Local
from django.db import transaction
from django.db.models import F
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete, pre_save

from . import models

POLICY_MODELS = (models.Level, models.Tier, models.Tenant, models.Rule, models.PriorityClass, models.PolicySettings)
BEFORE_A_WRITE = (pre_save, pre_delete, models.versioned_save)

# The token of the bump of each database alias's open transaction, scoped as Django scopes its
# connections (per thread, and per async context).
_bumps = Local()


def bump_version(token: str = "") -> None:
    """Add one to the policy version (creating its row the first time), marked with `token`,
    the bumping transaction's."""
    if models.PolicyVersion.objects.filter(pk=1).update(number=F("number") + 1, bumped_by=token):
        return
    _, created = models.PolicyVersion.objects.get_or_create(pk=1, defaults={"number": 1, "bumped_by": token})
    if not created:
        # Another transaction created the row since our update found none (on PostgreSQL,
        # this one waited for it to commit): our change needs a bump of its own.
        models.PolicyVersion.objects.filter(pk=1).update(number=F("number") + 1, bumped_by=token)


def pending_version(using: str = "default") -> int | None:
    """The version the open transaction's policy change bumped to; None when it bumped none,
    or its bump was rolled back (with the savepoint that made it, or the whole transaction):
    the row then carries another transaction's token, or none."""
    token = getattr(_bumps, using, None)
    if token is None:
        return None
    return models.PolicyVersion.objects.filter(pk=1, bumped_by=token).values_list("number", flat=True).first()


def current_version() -> int:
    """The policy version as committed; 0 before any change."""
    return models.PolicyVersion.objects.filter(pk=1).values_list("number", flat=True).first() or 0


def policy_changed(sender=None, using="default", signal=None, action="", **kwargs) -> None:
    """Bump the version inside the transaction that changes the policy, once, before its
    first change writes a row: the bump commits with the change or rolls back with it,
    however many rows the transaction changes (a policy load touches hundreds). A bump after
    the commit (an on_commit hook) would leave a saved change unpublished, and report it as
    failed, if the database went away between the commit and the bump: workers reload only
    when the version moves.

    Before the first write, not after it: every policy write then takes the version row's
    lock before any other row's, so two of them wait for each other, never deadlock (on
    PostgreSQL, a load holding the version row and an edit holding a tenant's row that the
    load goes on to change did). Outside a transaction the bump comes after the change,
    which is committed already: a worker reading in between would miss it."""
    before = signal in BEFORE_A_WRITE or action.startswith("pre_")  # m2m_changed: pre_add, post_add, ...
    connection = transaction.get_connection(using)
    if not connection.in_atomic_block:
        if not before:
            bump_version()
        return
    if not before:
        return
    if pending_version(using) is not None:
        return
    token = secrets.token_hex(16)
    bump_version(token)
    setattr(_bumps, using, token)
    # Once committed, the token must go, or this connection's next transaction would take the
    # committed bump for its own. (Only an on-commit hook registered before this one, not
    # robust, and raising, which the committing caller sees, could keep this one from running.)
    transaction.on_commit(partial(_committed, using, token), using=using, robust=True)


def _committed(using: str, token: str) -> None:
    if getattr(_bumps, using, None) == token:
        setattr(_bumps, using, None)


def connect() -> None:
    from simple_history.signals import pre_create_historical_record

    from .history import keep_rules

    signals = {"pre-save": pre_save, "save": post_save, "pre-delete": pre_delete, "delete": post_delete}
    for model in POLICY_MODELS:
        for name, signal in signals.items():
            signal.connect(policy_changed, sender=model, dispatch_uid=f"policies-{name}-{model.__name__}")
    models.versioned_save.connect(policy_changed, dispatch_uid="policies-versioned-save")
    m2m_changed.connect(
        policy_changed, sender=models.PriorityClass.levels.through, dispatch_uid="policies-m2m-priority-levels"
    )
    for owner in (models.Tier, models.Tenant):
        # Each version of a tier or tenant in its history keeps the rules it had then.
        pre_create_historical_record.connect(
            keep_rules, sender=owner.history.model, dispatch_uid=f"policies-history-rules-{owner.__name__}"
        )
