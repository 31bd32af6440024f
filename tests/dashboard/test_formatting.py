"""The console's durations: seconds, minutes, hours, and days from two days on."""

import math

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
