"""schemathesis against /api/schema/: every operation, with every check, as a decide token and
as an admin token, on SPEC.md's example policy. Derandomized, so that a run is the same run
every time: a failure here is a real one, never a flake.

The schema is read by each caller with its own token, once the policy is loaded: it lists the
levels, tiers and priority classes configured then (policies/api/schema_hooks.py), so data
that fits the schema is data the server takes. schemathesis runs every operation of that one
schema in one test (its subtests), so each operation starts from the loaded policy again: a
level that one operation renamed would otherwise be a stale name in the next one's schema.
"""

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, transaction
from hypothesis import HealthCheck, Phase, settings
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from .conftest import make_token

pytestmark = pytest.mark.slow

EXAMPLES = 30  # per operation and scope


@pytest.fixture(autouse=True)
def node_id_for_schemathesis(request):
    # schemathesis 4.32.5 reads and renames `item._nodeid`, which pytest 9.2 no longer has.
    request.node._nodeid = request.node.nodeid


@pytest.fixture(params=["decide", "admin"])
def scope(request):
    return request.param


@pytest.fixture
def token(loaded, scope):
    return make_token("decide") if scope == "decide" else make_token("admin", "ops")


@pytest.fixture
def live_schema(token):
    # As Django's test client does: a request does not close the test's connection, which is
    # inside the test's transaction (on PostgreSQL that would end it; SQLite's in-memory
    # database ignores a close).
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield schemathesis.openapi.from_wsgi(
        "/api/schema/", get_wsgi_application(), headers={"Authorization": f"Bearer {token}"}
    )
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def afresh(live_schema):
    """`afresh(operation)` before each case: the first case of an operation rolls the database
    back to where it stood when the schema was read."""
    loaded = transaction.savepoint()
    current = []

    def afresh(operation: str) -> None:
        if current != [operation]:
            transaction.savepoint_rollback(loaded)  # the savepoint stays, for the next operation
            current[:] = [operation]

    return afresh


SETTINGS = {
    "max_examples": EXAMPLES,
    "deadline": None,
    "derandomize": True,
    "database": None,
    "suppress_health_check": list(HealthCheck),
}


@pytest.mark.sqlite
@schemathesis.pytest.from_fixture("live_schema").parametrize()
@settings(**SETTINGS)
def test_every_operation_passes_every_check(case, token, afresh):
    """Every phase: the schema's examples, the coverage phase's boundary values of each field
    (most of the time: thousands of requests an operation), and fuzzing."""
    check(case, token, afresh)


@pytest.mark.postgres
@schemathesis.pytest.from_fixture("live_schema").parametrize()
@settings(**SETTINGS, phases=[Phase.reuse, Phase.generate, Phase.target, Phase.shrink])
def test_every_operation_passes_every_check_fuzzed(case, token, afresh):
    """On PostgreSQL, fuzzing alone: what differs there is what the database refuses (a NUL in
    a text column, a number past a column's range), which generated bodies find; the coverage
    phase's boundary values of each field meet the same code on SQLite's pass."""
    check(case, token, afresh)


def check(case, token, afresh) -> None:
    afresh(case.operation.label)
    excluded = []
    if case.operation.path.startswith("/api/v1/authz"):
        # Forward-auth reads its request from header fields and receives every other field
        # the client sent: an unknown header is not bad input there (schemathesis adds one to
        # make a request "invalid"). Its bad input is tested in tests/api/test_authz.py.
        excluded.append(negative_data_rejection)
    response = case.call(headers={"Authorization": f"Bearer {token}"})
    if is_a_uniqueness_refusal(response):
        # A name twice in a list (two levels called "d"), or two rules of one level that would
        # be one state (core.rules' one_state: two quotas of a period whatever their limits):
        # uniqueness over a field of an array's items, which no schema can say. The 400 must
        # still be the API's, naming the field.
        excluded.append(positive_data_acceptance)
    case.validate_response(response, headers={"Authorization": f"Bearer {token}"}, excluded_checks=excluded)


def is_a_uniqueness_refusal(response) -> bool:
    """A 400 whose every field is refused as a name given twice or a rule repeating another."""
    if response.status_code != 400:
        return False
    fields = response.json().get("error", {}).get("fields") or {}
    return bool(fields) and all(
        str(reason).startswith("repeats ") or str(reason).endswith(" appears twice") for reason in fields.values()
    )
