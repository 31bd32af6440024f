"""Every committed policy change bumps the policy version, which workers poll to reload.

Each bump also logs the version it made (`PolicyChange`: when, by whom), and every history
record a change makes carries that version's number (`policy_version`), so that a version
lists what it changed. That costs one read and one insert per version, whatever the number of
rows it writes: a policy load of hundreds of rows is one version.
"""

from __future__ import annotations

import contextlib
import contextvars
import secrets
from collections.abc import Iterator
from functools import partial
from typing import Any

from asgiref.local import Local
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.db.models import F
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete, pre_save
from simple_history.models import HistoricalRecords
from simple_history.signals import pre_create_historical_record

from . import models
from .history import keep_rules

POLICY_MODELS = (
    models.Level,
    models.Tier,
    models.Tenant,
    models.Rule,
    models.PriorityClass,
    models.PolicySettings,
    models.Alert,
)
BEFORE_A_WRITE = (pre_save, pre_delete, models.versioned_save)

# The token of the bump of each database alias's open transaction, scoped as Django scopes its
# connections (per thread, and per async context).
_bumps = Local()

# Who changes the policy when no request says so (a management command).
_acting: contextvars.ContextVar[str] = contextvars.ContextVar("policies_acting", default="")


@contextlib.contextmanager
def acting_as(name: str) -> Iterator[None]:
    """Policy versions made inside this block name `name` as their author (`loadpolicies
    demo.yaml`), unless a request's user made them."""
    token = _acting.set(name)
    try:
        yield
    finally:
        _acting.reset(token)


def bump_version(token: str = "") -> int:
    """Add one to the policy version (creating its row the first time), marked with `token`,
    the bumping transaction's; log the version it made with its author, and return its
    number."""
    if not models.PolicyVersion.objects.filter(pk=1).update(number=F("number") + 1, bumped_by=token):
        _, created = models.PolicyVersion.objects.get_or_create(pk=1, defaults={"number": 1, "bumped_by": token})
        if not created:
            # Another transaction created the row since our update found none (on PostgreSQL,
            # this one waited for it to commit): our change needs a bump of its own.
            models.PolicyVersion.objects.filter(pk=1).update(number=F("number") + 1, bumped_by=token)
    number = models.PolicyVersion.objects.filter(pk=1).values_list("number", flat=True).get()
    user, by = _author()
    models.PolicyChange.objects.create(version=number, user=user, by=by[:150])
    return number


def _author() -> tuple[Any, str]:
    """The operator or service token of the request being served, else the command's name."""
    user = getattr(getattr(HistoricalRecords.context, "request", None), "user", None)
    if user is None or not user.is_authenticated:
        return None, _acting.get()
    if isinstance(user, AbstractBaseUser):
        return user, user.get_username()
    return None, str(user)  # a service token: token:<name>


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
            _tag_latest_record(sender, kwargs.get("instance"), bump_version())
        return
    if not before:
        return
    if pending_version(using) is not None:
        return
    token = secrets.token_hex(16)
    setattr(_bumps, using, (token, bump_version(token)))
    # Once committed, the token must go, or this connection's next transaction would take the
    # committed bump for its own. (Only an on-commit hook registered before this one, not
    # robust, and raising, which the committing caller sees, could keep this one from running.)
    transaction.on_commit(partial(_committed, using, token), using=using, robust=True)


def _committed(using: str, token: str) -> None:
    bump = getattr(_bumps, using, None)
    if bump is not None and bump[0] == token:
        setattr(_bumps, using, None)


def pending_version(using: str = "default") -> int | None:
    """The version the open transaction's policy change bumped to; None when it bumped none,
    or its bump was rolled back (with the savepoint that made it, or the whole transaction):
    the row then carries another transaction's token, or none."""
    bump = getattr(_bumps, using, None)
    if bump is None:
        return None
    return models.PolicyVersion.objects.filter(pk=1, bumped_by=bump[0]).values_list("number", flat=True).first()


def tag_record(sender, history_instance, using=None, **kwargs) -> None:
    """pre_create_historical_record: a record made inside a transaction carries the version
    that transaction's bump made (its first write bumped, before any row was written).

    The write that makes a record has just checked, in its pre_save, that its transaction's
    bump stands (or bumped): the number that bump made is read from memory, not the database
    (one query less per row of a policy load)."""
    using = using or "default"
    bump = getattr(_bumps, using, None)
    if bump is None or not transaction.get_connection(using).in_atomic_block:
        history_instance.policy_version = None
    else:
        history_instance.policy_version = bump[1]


def _tag_latest_record(sender, instance, number: int) -> None:
    """Outside a transaction the bump comes after the write, and after the history record it
    made: that record gets the version now."""
    if instance is None or instance.pk is None or not hasattr(type(instance), "history"):
        return
    history = type(instance).history.model
    latest = history.objects.filter(id=instance.pk).order_by("-history_date", "-history_id").values("history_id")[:1]
    history.objects.filter(history_id__in=latest).update(policy_version=number)


def connect() -> None:
    signals = {"pre-save": pre_save, "save": post_save, "pre-delete": pre_delete, "delete": post_delete}
    for model in POLICY_MODELS:
        for name, signal in signals.items():
            signal.connect(policy_changed, sender=model, dispatch_uid=f"policies-{name}-{model.__name__}")
    models.versioned_save.connect(policy_changed, dispatch_uid="policies-versioned-save")
    m2m_changed.connect(
        policy_changed, sender=models.PriorityClass.levels.through, dispatch_uid="policies-m2m-priority-levels"
    )
    for model in POLICY_MODELS:
        pre_create_historical_record.connect(
            tag_record, sender=model.history.model, dispatch_uid=f"policies-history-version-{model.__name__}"
        )
    for owner in (models.Tier, models.Tenant):
        # Each version of a tier or tenant in its history keeps the rules it had then.
        pre_create_historical_record.connect(
            keep_rules, sender=owner.history.model, dispatch_uid=f"policies-history-rules-{owner.__name__}"
        )
