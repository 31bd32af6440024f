"""The decision: a tuple of named fields, built fast, equal to another when all but the lease agree."""

import math

from core import Decision
from core.decision import (
    RATE_LIMITED,
    STORE_UNAVAILABLE,
    Finding,
    allowed,
    degraded_allowed,
    degraded_denied,
    denied,
    found,
    inline_allowed,
)


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
    assert base != base._replace(over_quota=("team: quota(100/day, soft)",))
    assert hash(base) != hash(base._replace(over_quota=("team: quota(100/day, soft)",)))
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
        "over_quota": (),
    }


# --- the constructors: every field by name, so that a field added or moved is caught --------


def fields(decision):
    return dict(zip(type(decision)._fields, decision))


def test_allowed_builds_every_field_by_name():
    assert fields(allowed(3.0, "l-1", ("team: x",), ("team: y",))) == {
        "allowed": True,
        "retry_after": 0.0,
        "blocked_by": None,
        "reason": "OK",
        "remaining": 3.0,
        "degraded": False,
        "lease": "l-1",
        "shadow_blocked": ("team: x",),
        "over_quota": ("team: y",),
    }
    assert type(allowed(3.0)) is Decision and allowed(3.0).lease is None and allowed(3.0).shadow_blocked == ()
    assert allowed(3.0).over_quota == ()


def test_denied_builds_every_field_by_name():
    assert fields(denied(2.5, "user: token_bucket(1, 1/s)", RATE_LIMITED, 0.5, ("team: x",))) == {
        "allowed": False,
        "retry_after": 2.5,
        "blocked_by": "user: token_bucket(1, 1/s)",
        "reason": RATE_LIMITED,
        "remaining": 0.5,
        "degraded": False,
        "lease": None,
        "shadow_blocked": ("team: x",),
        "over_quota": (),
    }


def test_the_degraded_constructors_build_every_field_by_name():
    assert fields(degraded_allowed()) == {**fields(Decision(True)), "degraded": True}
    assert fields(degraded_denied(1.0, "team: store unavailable")) == {
        "allowed": False,
        "retry_after": 1.0,
        "blocked_by": "team: store unavailable",
        "reason": STORE_UNAVAILABLE,
        "remaining": 0.0,
        "degraded": True,
        "lease": None,
        "shadow_blocked": (),
        "over_quota": (),
    }


def test_found_builds_every_field_by_name():
    assert fields(found(2, 1.5, 0.0, (1,), (3,))) == {
        "blocker": 2,
        "wait": 1.5,
        "remaining": 0.0,
        "shadows": (1,),
        "over": (3,),
    }
    assert type(found(-1, 0.0, 4.0)) is Finding and found(-1, 0.0, 4.0).shadows == found(-1, 0.0, 4.0).over == ()


def test_the_inline_allowed_of_generated_code_follows_the_fields_of_decision():
    source, names = inline_allowed("left")
    built = eval(source, {**names, "left": 7.0})
    assert type(built) is Decision and fields(built) == fields(allowed(7.0))
