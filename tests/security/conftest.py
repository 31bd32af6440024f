"""Fixtures for the security tests: SPEC.md's example policy loaded on the in-process store,
the operator account as `manage.py ensureoperator` makes it (a superuser), a logged-in user
who is not staff, and service tokens of each scope, live or revoked."""

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from policies.models import ServiceToken
from tests.api.conftest import clock, load, make_token, memory_engine, policy_doc  # noqa: F401  (fixtures)

OPERATOR_PASSWORD = "operator-pw-for-tests-5d1c"


@pytest.fixture
def loaded(memory_engine, load, policy_doc):  # noqa: F811
    """SPEC.md's example policy, loaded, deciding on the in-process store."""
    load(policy_doc)
    return memory_engine


@pytest.fixture
def operator(db):
    """An operator, as `manage.py ensureoperator` makes one: a superuser. Logged in with
    `force_login`: no password, so that no test pays for hashing one it never types."""
    return get_user_model().objects.create_superuser("operator", password=None)


@pytest.fixture
def operator_with_password(db):
    """The operator, with a password to type into the login form."""
    return get_user_model().objects.create_superuser("operator", password=OPERATOR_PASSWORD)


@pytest.fixture
def member(db):
    """A user who may log in but is no operator (not staff)."""
    return get_user_model().objects.create_user("member", password=None)


def revoked_token(scope: str = "admin") -> str:
    """A token that worked once and was revoked, as the admin's "Revoke" action does it."""
    token = make_token(scope, "retired-script")
    row = ServiceToken.objects.get(prefix=token.split("_")[1])
    row.revoked_at = timezone.now()
    row.save(update_fields=["revoked_at"])  # post_save empties the process's token cache
    return token
