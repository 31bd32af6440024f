"""Configs that cannot build a limiter fail with a ConfigError naming the level, the rule
and the field; the registry is the one list of rule types."""

import math

import pytest

from core import RULES, ConfigError, HierarchicalLimiter, Param, Rule, register

from .helpers import fixed_window, token_bucket

BUILT_IN = {"token_bucket", "gcra", "sliding_window", "sliding_window_counter", "fixed_window", "concurrency"}


def config_error(config, priorities=None):
    with pytest.raises(ConfigError) as raised:
        HierarchicalLimiter.from_config(config, priorities=priorities)
    return raised.value


# Each bad rule sits at index 1 of the `team` level, so the path must name both.
BAD_RULES = {
    "unknown type": ({"type": "leaky_bucket", "capacity": 1}, "team[1].type", "leaky_bucket"),
    "missing type": ({"capacity": 1}, "team[1].type", "unknown rule type"),
    "missing param": ({"type": "token_bucket", "capacity": 5}, "team[1].per_second", "required"),
    "negative param": (token_bucket(-1, 1), "team[1].capacity", "greater than 0"),
    "zero capacity": (token_bucket(0, 1), "team[1].capacity", "greater than 0"),
    "negative refill": (token_bucket(5, -1), "team[1].per_second", "at least 0"),
    "zero window": ({"type": "sliding_window", "limit": 5, "window": 0}, "team[1].window", "at least 0.001"),
    "zero fixed window": ({"type": "fixed_window", "limit": 5, "window": 0}, "team[1].window", "at least 0.001"),
    # A denormal window made now / window infinite (an OverflowError in a what-if's replay).
    "denormal window": ({"type": "sliding_window_counter", "limit": 5, "window": 5e-324}, "team[1].window", "0.001"),
    "microsecond window": ({"type": "fixed_window", "limit": 5, "window": 1e-6}, "team[1].window", "0.001"),
    "NUL in a label": (token_bucket(5, 1, label="RPM\x00"), "team[1].label", "NUL"),
    "unknown param": ({**token_bucket(5, 1), "refill": 2}, "team[1]", "'refill'"),
    "string number": (token_bucket("5", 1), "team[1].capacity", "number"),
    "bool number": (token_bucket(True, 1), "team[1].capacity", "number"),
    "none number": (token_bucket(None, 1), "team[1].capacity", "number"),
    "nan": (token_bucket(math.nan, 1), "team[1].capacity", "finite"),
    "infinity": (token_bucket(5, math.inf), "team[1].per_second", "finite"),
    "fractional slots": ({"type": "concurrency", "limit": 1.5}, "team[1].limit", "whole"),
    "zero lease": ({"type": "concurrency", "limit": 1, "lease": 0}, "team[1].lease", "greater than 0"),
    "zero gcra rate": ({"type": "gcra", "rate": 0, "burst": 1}, "team[1].rate", "greater than 0"),
    "empty label": (token_bucket(5, 1, label=" "), "team[1].label", "non-empty"),
    "non-bool shadow": (token_bucket(5, 1, shadow="yes"), "team[1].shadow", "true or false"),
    "unknown counts": (token_bucket(5, 1, counts="tokens"), "team[1].counts", "requests"),
    "not a mapping": (["token_bucket", 5, 1], "team[1]", "mapping"),
}


@pytest.mark.parametrize("bad, path, words", BAD_RULES.values(), ids=BAD_RULES.keys())
def test_a_bad_rule_is_refused_with_the_level_index_and_field_named(bad, path, words):
    error = config_error({"user": [token_bucket(5, 1)], "team": [token_bucket(9, 1), bad]})
    assert error.path == path
    assert str(error).startswith(f"{path}: ")
    assert words in str(error)


def test_an_unknown_rule_type_lists_the_known_ones():
    error = config_error({"user": [{"type": "leaky_bucket"}]})
    for name in BUILT_IN:
        assert name in str(error)


def test_an_unknown_param_error_lists_the_known_params():
    error = config_error({"user": [{**token_bucket(5, 1), "refill": 2}]})
    assert "capacity" in str(error) and "per_second" in str(error)


def test_a_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("config", [None, [], "user"], ids=repr)
def test_a_config_that_is_not_a_mapping_is_refused(config):
    config_error(config)


def test_a_level_whose_rules_are_not_a_list_is_refused_naming_the_level():
    error = config_error({"user": token_bucket(5, 1)})
    assert error.path == "user"


@pytest.mark.parametrize("name", ["", "  ", 3], ids=repr)
def test_a_level_name_must_be_a_non_empty_string(name):
    config_error({name: [token_bucket(5, 1)]})


def test_the_same_rule_twice_at_one_level_is_refused_naming_the_repeat():
    # Same type and parameters would mean one shared bucket charged twice per request.
    error = config_error({"user": [token_bucket(5, 1), fixed_window(9, 60), token_bucket(5, 1)]})
    assert error.path == "user[2]"


def test_the_same_rule_at_two_levels_is_two_buckets():
    limiter = HierarchicalLimiter.from_config({"user": [token_bucket(1, 0)], "team": [token_bucket(1, 0)]})
    assert limiter.acquire({"user": "x", "team": "x"}).allowed
    assert not limiter.acquire({"user": "y", "team": "x"}).allowed
    assert not limiter.acquire({"user": "x", "team": "y"}).allowed


def test_a_level_with_no_rules_is_accepted_and_limits_nothing():
    limiter = HierarchicalLimiter.from_config({"user": []})
    assert limiter.acquire({"user": "u"}, cost=1e9).allowed


def test_defaults_fill_in_optional_params():
    limiter = HierarchicalLimiter.from_config({"user": [{"type": "concurrency", "limit": 2}]})
    assert limiter.inspect("user", "u")[0]["rule"].startswith("concurrency(2, lease 60s)")


# --- priority classes ----------------------------------------------------------------------

LEVELS = {"user": [token_bucket(5, 1)], "global": [token_bucket(100, 10)]}

BAD_PRIORITIES = {
    "unknown level": ({"batch": {"watermark": 0.2, "levels": ["team"]}}, "priorities.batch.levels[0]", "'team'"),
    "watermark of one": ({"batch": {"watermark": 1}}, "priorities.batch.watermark", "1"),
    "watermark above one": ({"batch": {"watermark": 1.5}}, "priorities.batch.watermark", "1"),
    "negative watermark": ({"batch": {"watermark": -0.1}}, "priorities.batch.watermark", "0"),
    "nan watermark": ({"batch": {"watermark": math.nan}}, "priorities.batch.watermark", "number"),
    "string watermark": ({"batch": {"watermark": "0.2"}}, "priorities.batch.watermark", "number"),
    "levels not a list": ({"batch": {"watermark": 0.2, "levels": "global"}}, "priorities.batch.levels", "list"),
    "unknown field": ({"batch": {"watermark": 0.2, "floor": 3}}, "priorities.batch", "'floor'"),
    "not a mapping": ({"batch": 0.2}, "priorities.batch", "watermark"),
}


@pytest.mark.parametrize("priorities, path, words", BAD_PRIORITIES.values(), ids=BAD_PRIORITIES.keys())
def test_a_bad_priority_class_is_refused_naming_the_class_and_field(priorities, path, words):
    error = config_error(LEVELS, priorities)
    assert error.path == path
    assert words in error.reason


def test_an_unknown_level_in_a_priority_class_lists_the_known_levels():
    error = config_error(LEVELS, {"batch": {"watermark": 0.2, "levels": ["team"]}})
    assert "user" in str(error) and "global" in str(error)


# --- the registry and plug-ins -------------------------------------------------------------


def test_the_registry_holds_the_six_built_in_rule_types():
    assert BUILT_IN <= set(RULES)
    assert all(RULES[name].type_name == name for name in BUILT_IN)


def test_a_plug_ins_declared_params_are_validated_like_the_built_ins(plugin_name):
    @register(plugin_name("threshold"))
    class Threshold(Rule):
        stateful = False
        params = (Param("level", help="A bound.", minimum=0, maximum=10),)

        def wait_for_key(self, key, now, cost):
            return 0.0

    too_big = config_error({"user": [{"type": Threshold.type_name, "level": 11}]})
    assert too_big.path == "user[0].level" and "at most 10" in str(too_big)
    missing = config_error({"user": [{"type": Threshold.type_name}]})
    assert missing.path == "user[0].level" and "required" in str(missing)
    assert HierarchicalLimiter.from_config({"user": [{"type": Threshold.type_name, "level": 3}]})


def test_a_newly_registered_type_is_listed_as_known(plugin_name):
    name = plugin_name("listed")

    @register(name)
    class Listed(Rule):
        stateful = False

    assert name in str(config_error({"user": [{"type": "nope"}]}))


def test_register_refuses_a_class_that_is_not_a_rule(plugin_name):
    name = plugin_name("not_a_rule")
    with pytest.raises(TypeError):
        register(name)(dict)
    assert name not in RULES


def test_a_plug_in_missing_a_required_method_says_which(plugin_name):
    @register(plugin_name("half_done"))
    class HalfDone(Rule):
        pass

    limiter = HierarchicalLimiter.from_config({"user": [{"type": HalfDone.type_name}]})
    with pytest.raises(NotImplementedError, match="wait"):
        limiter.acquire({"user": "u"})


def test_a_param_of_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind"):
        Param("size", kind="colour")


# --- choices and optional texts ---------------------------------------------------------------


def test_a_choice_takes_one_of_its_choices_and_names_them_when_refused():
    period = Param("period", kind="choice", choices=("day", "month"), help="When it resets.")
    assert period.clean("day", "team[0]") == "day"
    with pytest.raises(ConfigError, match="must be one of day, month, not 'year'") as refused:
        period.clean("year", "team[0]")
    assert refused.value.path == "team[0].period"
    assert period.schema() == {"type": "string", "description": "When it resets.", "enum": ["day", "month"]}


def test_a_choice_is_declared_with_its_choices_and_a_default_among_them():
    with pytest.raises(ValueError, match="has choices"):
        Param("period", kind="choice")
    with pytest.raises(ValueError, match="has choices"):
        Param("name", kind="string", choices=("a",))
    with pytest.raises(ValueError, match="default must be one of"):
        Param("period", kind="choice", choices=("day",), default="week")


def test_an_optional_parameter_with_no_default_value_takes_null_as_left_out():
    class_name = Param("demote_to", kind="string", default=None, help="A class.")
    assert not class_name.required
    assert class_name.clean(None, "") is None and class_name.clean("batch", "") == "batch"
    with pytest.raises(ConfigError, match="non-empty string"):
        class_name.clean("", "")
    assert class_name.schema() == {"type": ["string", "null"], "description": "A class.", "default": None}
