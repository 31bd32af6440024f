"""Bad input, generated: API bodies and policy files full of bad values (negative and zero
limits, NaN and infinity, huge numbers, wrong types, unknown fields, unicode keys, deep
nesting, bodies of 10 MB). Whatever comes in, the answer is a 400 in the error shape (a
`CommandError` for a policy file), and nothing changes: no row of the policy store, and no
bucket of the limiter's store.

Each generated body is a valid one with one thing made bad, so that it must be refused,
plus one test that throws arbitrary JSON at every endpoint and asks only that nothing is a
5xx. Examples are few per test (hypothesis' defaults would take minutes): the strategies
aim at the edges instead. NaN and infinity go out as Python's json writes them (`NaN`,
`Infinity`), which is not JSON: the answer must still be a 400.
"""

from __future__ import annotations

import copy
import io
import json
import math

import pytest
import yaml
from django.core.management import CommandError, call_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core import RULES
from tests.api.conftest import clock, load, make_token, memory_engine, token_client  # noqa: F401  (fixtures)
from tests.policies.conftest import POLICY

from .test_database_outage import policy_rows

EXAMPLES = settings(
    max_examples=75,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
DEEP = 50_000  # levels of nesting: far past Python's recursion limit
DEEP_MARK = "\u2063deep\u2063"  # replaced, once serialised, by DEEP nested arrays
LONG_MARK = "\u2063long\u2063"  # replaced by a number of 5,000 digits (Python will not write one)

# --- bad values ----------------------------------------------------------------------------

NOT_JSON = st.sampled_from([math.nan, math.inf, -math.inf])
HUGE = st.sampled_from([1e16, 1.5e300, 10**16, 10**30, 2**64, 10**400, LONG_MARK])
NEGATIVE = st.one_of(st.floats(max_value=-1e-300, allow_nan=False, allow_infinity=False), st.integers(max_value=-1))
WRONG_TYPE = st.one_of(
    st.text(max_size=8),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.just(DEEP_MARK),
)
NOT_A_NUMBER_AT_LEAST_0 = st.one_of(NOT_JSON, HUGE, NEGATIVE, WRONG_TYPE)
NOT_A_NUMBER_ABOVE_0 = st.one_of(NOT_A_NUMBER_AT_LEAST_0, st.sampled_from([0, 0.0, -0.0]))
NOT_A_FRACTION = st.one_of(
    NOT_A_NUMBER_AT_LEAST_0, st.floats(min_value=1.0001, allow_nan=False), st.integers(min_value=2)
)
UNICODE = st.text(min_size=1, max_size=24)
NOT_A_NAME = st.one_of(
    st.text(min_size=1, max_size=12).filter(lambda s: not s.isascii() or " " in s),
    st.sampled_from(["", " ", "a b", "tier/1", "x" * 300]),
    st.integers(),
    st.booleans(),
    st.lists(st.text(max_size=2), max_size=2),
)
NOT_A_KEY = st.one_of(
    st.sampled_from(["", "x" * 257, "\ud800", "a\udfffb"]),
    st.integers(),
    st.booleans(),
    st.none(),
    st.lists(st.text(max_size=2), max_size=2),
    st.just(DEEP_MARK),
)


def unknown_field(known):
    return UNICODE.filter(lambda name: name not in known)


def body_text(body) -> str:
    """JSON as Python writes it (NaN stays NaN), with DEEP_MARK made into deep nesting."""
    text = json.dumps(body)
    return text.replace(json.dumps(DEEP_MARK), "[" * DEEP + "]" * DEEP).replace(json.dumps(LONG_MARK), "9" * 5000)


# --- bad bodies: a valid one with one thing made bad -------------------------------------------

VALID_KEYS = {"user": "u1", "team": "acme", "global": "*"}


@st.composite
def bad_decision(draw, reservation: bool = False):
    body = {"keys": dict(VALID_KEYS), "cost": 1, "priority": None}
    body.update({"hold": 30} if reservation else {"dry_run": False})
    known = tuple(body)
    slot = draw(
        st.sampled_from(
            ["cost", "keys", "key", "level", "priority", "unknown"] + (["hold"] if reservation else ["dry_run"])
        )
    )
    if slot == "cost":
        body["cost"] = draw(NOT_A_NUMBER_ABOVE_0)
    elif slot == "hold":
        body["hold"] = draw(st.one_of(NOT_A_NUMBER_ABOVE_0, st.floats(min_value=86_400.5, max_value=1e9)))
    elif slot == "keys":
        body["keys"] = draw(
            st.one_of(st.just({}), st.none(), st.text(max_size=4), st.lists(st.text(), max_size=2), st.just(DEEP_MARK))
        )
    elif slot == "key":
        body["keys"][draw(st.sampled_from(sorted(VALID_KEYS)))] = draw(NOT_A_KEY)
    elif slot == "level":
        body["keys"][draw(unknown_field(VALID_KEYS))] = "k"
    elif slot == "priority":
        body["priority"] = draw(
            st.one_of(
                UNICODE.filter(lambda p: p not in POLICY["priorities"]),
                st.integers(),
                st.booleans(),
                st.lists(st.none(), max_size=1),
            )
        )
    elif slot == "dry_run":
        body["dry_run"] = draw(st.one_of(st.integers(), st.text(max_size=5), st.lists(st.none(), max_size=1)))
    else:
        body[draw(unknown_field(known))] = draw(st.one_of(st.integers(), UNICODE, st.just(DEEP_MARK)))
    return body


@st.composite
def bad_batch(draw):
    good = {"keys": dict(VALID_KEYS), "cost": 1}
    shape = draw(st.sampled_from(["item", "requests", "unknown", "too many"]))
    if shape == "requests":
        return {
            "requests": draw(
                st.one_of(
                    st.just([]),
                    st.none(),
                    st.integers(),
                    st.text(max_size=3),
                    st.just({"keys": VALID_KEYS}),
                    st.just(DEEP_MARK),
                )
            )
        }
    if shape == "unknown":
        return {"requests": [good], draw(unknown_field(("requests",))): 1}
    if shape == "too many":
        return {"requests": [good] * 1001}
    items = [dict(good, keys=dict(VALID_KEYS)) for _ in range(draw(st.integers(1, 5)))]
    bad = draw(bad_decision())
    if "dry_run" in bad and bad["dry_run"] is False:
        del bad["dry_run"]  # dry runs are refused in a batch anyway; keep the drawn defect
    items[draw(st.integers(0, len(items) - 1))] = bad
    return {"requests": items}


RULE = {"type": "token_bucket", "capacity": 10, "per_second": 1}
PARAMS = {
    "token_bucket": ("capacity", "per_second"),
    "gcra": ("rate", "burst"),
    "fixed_window": ("limit", "window"),
    "sliding_window": ("limit", "window"),
    "sliding_window_counter": ("limit", "window"),
    "concurrency": ("limit", "lease"),
    "quota": ("limit", "period", "timezone", "mode", "demote_to"),
}
# A quota's parameters that are texts: anything but what they take (demote_to takes a class
# only in soft mode, and this quota is hard; null leaves it out, which is no defect).
QUOTA_TEXTS = {"period": {"hour", "day", "week", "month", "none"}, "timezone": set(), "mode": {"hard", "soft"}}
NOT_A_TIME_ZONE = st.one_of(
    st.sampled_from(["Mars/Olympus", "/etc/passwd", "../UTC", "Europe/", "UTC ", "zone.tab", "x" * 300, "a\x00b"]),
    st.integers(),
    st.none(),
    st.just(""),
)
VALID_RULES = {
    "token_bucket": RULE,
    "gcra": {"type": "gcra", "rate": 5, "burst": 10},
    "fixed_window": {"type": "fixed_window", "limit": 10, "window": 60},
    "sliding_window": {"type": "sliding_window", "limit": 10, "window": 60},
    "sliding_window_counter": {"type": "sliding_window_counter", "limit": 10, "window": 60},
    "concurrency": {"type": "concurrency", "limit": 10, "lease": 60},
    "quota": {"type": "quota", "limit": 100, "period": "day", "timezone": "Europe/Berlin"},
}


@st.composite
def bad_rule(draw):
    """A rule spec with one bad thing in it."""
    rule_type = draw(st.sampled_from(sorted(VALID_RULES)))
    rule = dict(VALID_RULES[rule_type])
    slot = draw(st.sampled_from(["param", "type", "unknown", "label", "shadow", "counts", "missing"]))
    if slot == "param":
        name = draw(st.sampled_from(PARAMS[rule_type]))
        if name == "timezone":
            rule[name] = draw(NOT_A_TIME_ZONE)
        elif name in QUOTA_TEXTS:
            rule[name] = draw(st.one_of(UNICODE.filter(lambda text: text not in QUOTA_TEXTS[name]), st.integers()))
        elif name == "demote_to":
            rule[name] = draw(st.one_of(UNICODE, st.integers()))
        else:
            rule[name] = draw(NOT_A_NUMBER_AT_LEAST_0 if name == "per_second" else NOT_A_NUMBER_ABOVE_0)
    elif slot == "type":
        rule["type"] = draw(st.one_of(UNICODE.filter(lambda t: t not in VALID_RULES), st.integers(), st.none()))
    elif slot == "unknown":
        rule[draw(unknown_field((*rule, "label", "shadow", "counts")))] = draw(st.one_of(st.integers(), UNICODE))
    elif slot == "label":
        rule["label"] = draw(
            st.one_of(
                st.integers(), st.booleans(), st.lists(st.none(), max_size=1), st.just("x" * 1000), st.just("\ud800")
            )
        )
    elif slot == "shadow":
        rule["shadow"] = draw(st.one_of(st.integers(), st.text(max_size=4), st.none()))
    elif slot == "counts":
        rule["counts"] = draw(st.one_of(UNICODE.filter(lambda c: c not in ("cost", "requests")), st.integers()))
    else:
        required = [param.name for param in RULES[rule_type].params if param.required]
        del rule[draw(st.sampled_from(required))]
    return rule


@st.composite
def bad_policy_write(draw):
    """(method, path, body) of a policy write with one bad thing in it."""
    kind = draw(st.sampled_from(["tier", "tenant", "level", "priority", "settings"]))
    if kind == "tier":
        body = {"name": "gold", "rules": {"team": [dict(RULE)]}}
        slot = draw(st.sampled_from(["name", "rule", "rules", "level", "unknown"]))
        if slot == "name":
            body["name"] = draw(NOT_A_NAME)
        elif slot == "rule":
            body["rules"]["team"] = [dict(RULE), draw(bad_rule())]
        elif slot == "rules":
            body["rules"] = draw(
                st.one_of(st.just({}), st.none(), st.integers(), st.just({"team": RULE}), st.just(DEEP_MARK))
            )
        elif slot == "level":
            body["rules"][draw(unknown_field(VALID_KEYS))] = [dict(RULE)]
        else:
            body[draw(unknown_field(body))] = 1
        return draw(
            st.sampled_from(
                [
                    ("POST", "/api/v1/tiers", body),
                    ("PUT", "/api/v1/tiers/pro", {**body, "name": body["name"], "version": 1}),
                ]
            )
        )
    if kind == "tenant":
        body = {"key": "newco", "tier": "pro", "overrides_until": None, "overrides": {"team": [dict(RULE)]}}
        slot = draw(st.sampled_from(["key", "tier", "until", "override", "unknown"]))
        if slot == "key":
            body["key"] = draw(st.one_of(st.sampled_from(["", "x" * 1000, "\ud800"]), st.integers(), st.none()))
        elif slot == "tier":
            body["tier"] = draw(st.one_of(UNICODE.filter(lambda t: t not in POLICY["tiers"]), st.integers()))
        elif slot == "until":
            body["overrides_until"] = draw(
                st.one_of(st.sampled_from(["tomorrow", "2026-13-45T99:00:00Z", ""]), st.integers(), st.booleans())
            )
        elif slot == "override":
            body["overrides"]["team"] = [draw(bad_rule())]
        else:
            body[draw(unknown_field(body))] = 1
        return ("POST", "/api/v1/tenants", body)
    if kind == "level":
        body = {"name": "region", "fail_mode": "local", "fallback_fraction": 0.5}
        slot = draw(st.sampled_from(["name", "fail_mode", "fraction", "position", "unknown"]))
        if slot == "name":
            body["name"] = draw(NOT_A_NAME)
        elif slot == "fail_mode":
            body["fail_mode"] = draw(
                st.one_of(UNICODE.filter(lambda m: m not in ("open", "closed", "local")), st.integers(), st.none())
            )
        elif slot == "fraction":
            body["fallback_fraction"] = draw(st.one_of(NOT_A_FRACTION, st.just(0)))
        elif slot == "position":
            # 10**16 is a position SQLite stores (PostgreSQL's column would not): not bad here.
            body["position"] = draw(
                st.one_of(
                    NEGATIVE,
                    st.sampled_from([2**63, 2**64, 10**30, 1e16, "3", True]),
                    st.text(max_size=3),
                    st.floats(0.1, 0.9),
                )
            )
        else:
            body[draw(unknown_field(body))] = 1
        return ("POST", "/api/v1/levels", body)
    if kind == "priority":
        body = {"name": "bulk", "watermark": 0.5, "levels": ["global"]}
        slot = draw(st.sampled_from(["name", "watermark", "levels", "unknown"]))
        if slot == "name":
            body["name"] = draw(NOT_A_NAME)
        elif slot == "watermark":
            body["watermark"] = draw(NOT_A_FRACTION)
        elif slot == "levels":
            body["levels"] = draw(
                st.one_of(
                    st.lists(unknown_field(VALID_KEYS), min_size=1, max_size=2),
                    st.text(max_size=3),
                    st.integers(),
                    st.just(DEEP_MARK),
                )
            )
        else:
            body[draw(unknown_field(body))] = 1
        return ("POST", "/api/v1/priorities", body)
    body = draw(
        st.one_of(
            st.fixed_dictionaries(
                {
                    "default_tier": st.one_of(
                        UNICODE.filter(lambda t: t not in POLICY["tiers"]), st.integers(), st.just("")
                    )
                }
            ),
            st.fixed_dictionaries({"default_tier": st.just("pro"), "x": UNICODE}),
        )
    )
    return (draw(st.sampled_from(["PUT", "PATCH"])), "/api/v1/settings", body)


# --- the API ---------------------------------------------------------------------------------


@pytest.fixture
def api_client(memory_engine, load):
    load(copy.deepcopy(POLICY))
    client = token_client(make_token("admin", "fuzz"))
    client.raise_request_exception = False  # a bug must show as the 500 it would be
    return client


def send(client, method: str, path: str, body) -> tuple[int, dict]:
    text = body if isinstance(body, str) else body_text(body)
    response = client.generic(method, path, text, content_type="application/json")
    try:
        answer = response.json()
    except ValueError:
        answer = {"not JSON": response.content[:200]}
    return response.status_code, answer


def assert_refused(status: int, answer: dict, sent=None) -> None:
    assert status == 400, (status, answer, repr(sent)[:500])
    error = answer["error"]
    assert error["code"] in ("invalid", "malformed_request") and error["message"], answer
    assert set(error) == {"code", "message", "fields"}


def assert_nothing_changed(before_rows, before_buckets, engine) -> None:
    assert policy_rows() == before_rows
    assert len(engine.store) == before_buckets


@EXAMPLES
@given(body=st.one_of(bad_decision(), bad_decision(reservation=True).map(lambda b: ("reservation", b))))
def test_a_bad_decision_or_reservation_is_a_400_and_takes_nothing(api_client, memory_engine, body):
    path = "/api/v1/decisions"
    if isinstance(body, tuple):
        path, body = "/api/v1/reservations", body[1]
    rows, buckets = policy_rows(), len(memory_engine.store)
    assert_refused(*send(api_client, "POST", path, body), (path, body))
    assert_nothing_changed(rows, buckets, memory_engine)


@EXAMPLES
@given(body=bad_batch())
def test_a_batch_with_anything_bad_is_a_400_and_takes_nothing(api_client, memory_engine, body):
    rows, buckets = policy_rows(), len(memory_engine.store)
    assert_refused(*send(api_client, "POST", "/api/v1/decisions/batch", body), body)
    assert_nothing_changed(rows, buckets, memory_engine)


@EXAMPLES
@given(write=bad_policy_write())
def test_a_bad_policy_write_is_a_400_and_changes_nothing(api_client, memory_engine, write):
    method, path, body = write
    rows, buckets = policy_rows(), len(memory_engine.store)
    assert_refused(*send(api_client, method, path, body), write)
    assert_nothing_changed(rows, buckets, memory_engine)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
ENDPOINTS = [
    ("POST", "/api/v1/decisions"),
    ("POST", "/api/v1/decisions/batch"),
    ("POST", "/api/v1/reservations"),
    ("POST", "/api/v1/reservations/abc/commit"),
    ("POST", "/api/v1/reservations/abc/cancel"),
    ("POST", "/api/v1/tiers"),
    ("PUT", "/api/v1/tiers/pro"),
    ("PATCH", "/api/v1/tiers/pro"),
    ("POST", "/api/v1/tenants"),
    ("PATCH", "/api/v1/tenants/acme"),
    ("POST", "/api/v1/levels"),
    ("PATCH", "/api/v1/levels/team"),
    ("POST", "/api/v1/priorities"),
    ("PATCH", "/api/v1/priorities/batch"),
    ("PUT", "/api/v1/settings"),
    ("PATCH", "/api/v1/settings"),
]


@settings(EXAMPLES, max_examples=150)
@given(endpoint=st.sampled_from(ENDPOINTS), body=JSON)
def test_any_json_at_all_is_never_a_5xx_and_a_refusal_changes_nothing(api_client, memory_engine, endpoint, body):
    rows = policy_rows()
    status, answer = send(api_client, *endpoint, body)
    assert status < 500, (status, answer)
    if status >= 400:
        assert set(answer["error"]) == {"code", "message", "fields"}, answer
        assert policy_rows() == rows


@pytest.mark.parametrize("method, path", ENDPOINTS)
@pytest.mark.parametrize("what", ["10 MB", "deep nesting"])
def test_a_10_mb_or_deeply_nested_body_is_a_400(api_client, memory_engine, method, path, what):
    if what == "10 MB":
        text = json.dumps({"keys": {"user": "x" * 10_000_000}})
    else:
        text = body_text({"keys": DEEP_MARK})
    rows = policy_rows()
    assert_refused(*send(api_client, method, path, text))
    assert policy_rows() == rows


# --- policy files ----------------------------------------------------------------------------


@st.composite
def bad_policy_file(draw):
    """SPEC.md's example policy with one bad thing in it."""
    doc = copy.deepcopy(POLICY)
    slot = draw(
        st.sampled_from(
            [
                "rule",
                "top",
                "tier",
                "tenant",
                "tenant field",
                "level",
                "fraction",
                "watermark",
                "default_tier",
                "global",
                "deep",
                "levels",
            ]
        )
    )
    if slot == "rule":
        tier = draw(st.sampled_from(sorted(doc["tiers"])))
        level = draw(st.sampled_from(sorted(doc["tiers"][tier])))
        rules = doc["tiers"][tier][level]
        rules[draw(st.integers(0, len(rules) - 1))] = draw(bad_rule())
    elif slot == "top":
        doc[draw(unknown_field(doc))] = draw(st.one_of(st.integers(), UNICODE))
    elif slot == "tier":
        doc["tiers"][draw(NOT_A_NAME.filter(lambda n: isinstance(n, str)))] = {"team": [dict(RULE)]}
    elif slot == "tenant":
        doc["tenants"]["newco"] = {"tier": draw(UNICODE.filter(lambda t: t not in doc["tiers"]))}
    elif slot == "tenant field":
        doc["tenants"]["acme"][draw(unknown_field(("tier", "overrides", "overrides_until")))] = 1
    elif slot == "level":
        doc["levels"][0]["fail_mode"] = draw(
            st.one_of(UNICODE.filter(lambda m: m not in ("open", "closed", "local")), st.integers())
        )
    elif slot == "fraction":
        doc["levels"][2]["fallback_fraction"] = draw(st.one_of(NOT_A_FRACTION, st.just(0)))
    elif slot == "watermark":
        doc["priorities"]["batch"]["watermark"] = draw(NOT_A_FRACTION)
    elif slot == "default_tier":
        doc["default_tier"] = draw(st.one_of(UNICODE.filter(lambda t: t not in doc["tiers"]), st.integers()))
    elif slot == "global":
        doc["global"] = [draw(bad_rule())]
    elif slot == "deep":
        doc["tiers"]["free"]["team"] = DEEP_MARK
    else:
        doc["levels"] = draw(st.one_of(st.just([]), st.integers(), st.just([{"name": "user"}, {"name": "user"}])))
    return doc


@pytest.fixture
def loaded_store(transactional_db, load):
    load(copy.deepcopy(POLICY))


@EXAMPLES
@given(doc=bad_policy_file(), as_yaml=st.booleans())
def test_a_bad_policy_file_is_a_clean_command_error_and_loads_nothing(loaded_store, tmp_path, doc, as_yaml):
    if as_yaml and DEEP_MARK not in json.dumps(doc) and LONG_MARK not in json.dumps(doc):
        path = tmp_path / "policy.yaml"
        path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    else:
        path = tmp_path / "policy.json"
        path.write_text(body_text(doc))
    rows = policy_rows()
    try:
        call_command("loadpolicies", str(path), stdout=io.StringIO())
    except CommandError as refused:
        assert str(path) in str(refused)
    else:
        pytest.fail(f"loaded: {path.read_text()[:1000]}")
    assert policy_rows() == rows


def test_a_10_mb_policy_file_is_a_clean_command_error(loaded_store, tmp_path):
    doc = copy.deepcopy(POLICY)
    doc["tiers"]["free"]["team"][0]["label"] = "x" * 10_000_000
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(doc))
    rows = policy_rows()
    with pytest.raises(CommandError):
        call_command("loadpolicies", str(path), stdout=io.StringIO())
    assert policy_rows() == rows


# --- what the generated inputs found, pinned -----------------------------------------------------

PAST_A_FLOAT = 10**400  # an integer JSON can carry and no float can hold


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("POST", "/api/v1/decisions", {"keys": {"user": "u"}, "cost": PAST_A_FLOAT}),
        ("POST", "/api/v1/reservations", {"keys": {"user": "u"}, "hold": PAST_A_FLOAT}),
        ("POST", "/api/v1/tiers", {"name": "gold", "rules": {"team": [{**RULE, "capacity": PAST_A_FLOAT}]}}),
        ("POST", "/api/v1/levels", {"name": "region", "fallback_fraction": PAST_A_FLOAT}),
        ("POST", "/api/v1/priorities", {"name": "bulk", "watermark": -PAST_A_FLOAT}),
        ("POST", "/api/v1/decisions", {"keys": {"user": "\ud800"}}),
        ("POST", "/api/v1/tiers", {"name": "gold", "rules": {"team": [{**RULE, "label": "a\udfff"}]}}),
        # PostgreSQL's text refuses a NUL: it was a 503 there, not a 400.
        ("POST", "/api/v1/tiers", {"name": "gold", "rules": {"team": [{**RULE, "label": "RPM\u0000"}]}}),
        ("POST", "/api/v1/tenants", {"key": 7, "tier": "pro"}),
        ("POST", "/api/v1/levels", {"name": "region", "position": "3"}),
        ("POST", "/api/v1/priorities", {"name": "bulk", "watermark": "0.5"}),
    ],
)
def test_numbers_past_a_float_surrogates_and_numbers_for_strings_are_400s(api_client, method, path, body):
    rows = policy_rows()
    assert_refused(*send(api_client, method, path, body), body)
    assert policy_rows() == rows


def test_a_policy_file_with_a_label_longer_than_its_column_or_a_surrogate_is_refused(loaded_store, tmp_path):
    for label in ("x" * 65, "\ud800", "a\u0000"):
        doc = copy.deepcopy(POLICY)
        doc["tiers"]["free"]["team"][0]["label"] = label
        path = tmp_path / "policy.json"
        path.write_text(json.dumps(doc))
        with pytest.raises(CommandError, match="label|surrogate|NUL"):
            call_command("loadpolicies", str(path), stdout=io.StringIO())
