"""schemathesis against /api/schema/: every operation, with every check, as a decide token and
as an admin token, on SPEC.md's example policy. Derandomized, so that a run is the same run
every time: a failure here is a real one, never a flake.

The operations in KNOWN_FAILURES fail today for reasons that need more than a small fix (each
reason says which); they are expected to fail, strictly: once one passes, the test says so and
it must leave the list.
"""

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, settings

from .conftest import make_token

pytestmark = pytest.mark.slow

SCHEMA = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application())
EXAMPLES = 30  # per operation and scope

# The schema cannot name what only the database knows: the configured levels (a decision's
# `keys`, a rule set's level names, a priority class's levels, the buckets' `level`), tiers
# (a tenant's `tier`, the default tier) and priority classes. A schema-valid request naming
# one that does not exist is rightly a 400, which schemathesis reads as valid data refused.
REFERENCES = "names a level, tier or priority class that the schema cannot know is not configured"
# The create and change requests share one schema, so `version` (the optimistic lock, sent
# by PUT and PATCH) is offered on POST too, where the server refuses it.
VERSION = f"`version` is in the create request's schema, and the server refuses it there; also {REFERENCES}"
KNOWN_FAILURES = {
    "POST /api/v1/decisions": REFERENCES,
    "POST /api/v1/decisions/batch": REFERENCES,
    "POST /api/v1/reservations": REFERENCES,
    "GET /api/v1/buckets": REFERENCES,
    "PUT /api/v1/settings": REFERENCES,
    "PATCH /api/v1/settings": REFERENCES,
    "POST /api/v1/tiers": VERSION,
    "POST /api/v1/tenants": VERSION,
    "POST /api/v1/levels": VERSION,
    "POST /api/v1/priorities": VERSION,
    # Request schemas allow properties they do not name; the server refuses unknown fields.
    "POST /api/v1/reservations/{reservation_id}/commit": "the request schema does not say additionalProperties: false",
    # `window` is a free-form string in the schema; the server takes 1 s to 24 h only.
    "GET /api/v1/stats/blocked": "`window` has no pattern in the schema",
}


@pytest.fixture
def tokens(loaded):
    return {"decide": make_token("decide"), "admin": make_token("admin", "ops")}


# A decide token may call these; every other operation answers it 403, which passes every check.
DECIDE_OPERATIONS = ("POST /api/v1/decisions", "POST /api/v1/reservations")


@pytest.fixture(autouse=True)
def known_failure(request):
    operation = request.node.name.split("[", 1)[-1].split("]", 1)[0]  # test_...[POST /api/v1/tiers][admin]
    scope = request.node.callspec.params["scope"]
    if operation in KNOWN_FAILURES and (scope == "admin" or operation.startswith(DECIDE_OPERATIONS)):
        request.node.add_marker(pytest.mark.xfail(reason=KNOWN_FAILURES[operation], strict=True))


@pytest.mark.parametrize("scope", ["decide", "admin"])
@SCHEMA.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_every_operation_passes_every_check(case, scope, tokens):
    case.call_and_validate(headers={"Authorization": f"Bearer {tokens[scope]}"})
