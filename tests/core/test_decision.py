"""The decision: a tuple of named fields, built fast, equal to another when all but the lease agree."""

import math

from core import Decision
from core.decision import allowed


def test_two_decisions_that_differ_only_in_their_lease_are_equal_and_make_a_set_of_one():
    first = Decision(True, 0.0, None, "OK", 4.0, lease="lease-1")
    second = Decision(True, 0.0, None, "OK", 4.0, lease="lease-2")
    assert first == second
    assert hash(first) == hash(second)
    assert len({first, second}) == 1


def test_decisions_that_differ_in_anything_else_are_not_equal():
    base = Decision(False, 2.0, "user: token_bucket(1, 1/s)", "RATE_LIMITED", 0.0)
    assert base != base._replace(retry_after=3.0)
    assert base != base._replace(shadow_blocked=("team: token_bucket(5, 1/s)",))
    assert base != base._replace(degraded=True)
    assert len({base, base._replace(retry_after=3.0)}) == 2


def test_the_fast_allowed_decision_equals_the_one_built_field_by_field():
    assert allowed(7.0) == Decision(True, 0.0, None, "OK", 7.0)
    assert hash(allowed(7.0)) == hash(Decision(True, 0.0, None, "OK", 7.0))


def test_a_decision_has_defaults_for_every_field_after_allowed():
    decision = Decision(True)
    assert decision.as_dict() == {
        "allowed": True,
        "retry_after": 0.0,
        "blocked_by": None,
        "reason": "OK",
        "remaining": math.inf,
        "degraded": False,
        "lease": None,
        "shadow_blocked": (),
    }
