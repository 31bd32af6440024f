"""The console's durations: seconds, minutes, hours, and days from two days on."""

import math
from pathlib import Path

import pytest

from limiter_admin.console.formatting import duration


@pytest.mark.parametrize(
    "seconds, text",
    [
        (None, "never"),
        (math.inf, "never"),
        (0, "0 s"),
        (0.25, "0.25 s"),
        (2.5, "2.5 s"),
        (59, "59 s"),
        (200, "3 min 20 s"),
        (3600, "1 h"),
        (3900, "1 h 5 min"),
        (47 * 3600 + 59 * 60, "47 h 59 min"),
        (48 * 3600, "2 d"),
        (681 * 3600 + 38 * 60, "28 d 9 h"),
    ],
)
def test_a_duration_reads_in_the_largest_units_that_fit(seconds, text):
    assert duration(seconds) == text


def test_the_demo_policys_rules_have_colours_far_apart(memory_engine, load):
    """Issue 25: hashed hues made token_bucket(50, 10/s) and gcra(50/s, burst 200) the same
    crimson. The policy's rules are now spread around the wheel: no two within 20 degrees at
    the same lightness."""
    import itertools
    import re

    import yaml

    from limiter_admin.console.formatting import policy_colours, rule_colour
    from policies.compile import policy_cache

    demo = Path(__file__).parents[2] / "policies" / "fixtures" / "demo.yaml"
    load(yaml.safe_load(demo.read_text()))
    colours = policy_colours(policy_cache().current())
    assert len(colours) >= 8 and rule_colour("user: gcra(50/s, burst 200)") == colours["user: gcra(50/s, burst 200)"]
    parsed = [tuple(map(int, re.findall(r"\d+", colour))) for colour in colours.values()]
    for (h1, _, l1), (h2, _, l2) in itertools.combinations(parsed, 2):
        assert l1 != l2 or min(abs(h1 - h2), 360 - abs(h1 - h2)) >= 20, (h1, l1, h2, l2)
    assert rule_colour("user: no_longer(1)") == rule_colour("user: no_longer(1)")  # hashed, stable
