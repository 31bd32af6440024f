"""Durations as operators write them: `300`, `300s`, `5m`, `1h`, `24h`, `1d`: whole numbers of
one unit, without spaces or leading zeros. The REST API's query strings, the console's windows
and an alert's `window` (the admin, the API and the policy file) read them with these.
"""

from __future__ import annotations

import re
from typing import Any

UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_WINDOW = 86_400


def whole_numbers_up_to(high: int) -> str:
    """A regular expression for the whole numbers 1 to `high`, written without leading zeros:
    1 to 24 is `[1-9]|1[0-9]|2[0-4]`."""
    digits = str(high)
    shorter = len(digits) - 2  # how many more digits a number shorter than `high` may have
    options = [f"[1-9][0-9]{{0,{shorter}}}" if shorter > 0 else "[1-9]"] if len(digits) > 1 else []
    for i, digit in enumerate(map(int, digits)):
        low = 1 if i == 0 else 0
        if digit > low:  # `high`'s first i digits, then a smaller digit, then any digits
            rest = len(digits) - i - 1
            smaller = f"[{low}-{digit - 1}]" if digit - 1 > low else str(low)
            options.append(digits[:i] + smaller + ("" if rest == 0 else "[0-9]" if rest == 1 else f"[0-9]{{{rest}}}"))
    return "|".join([*options, digits])


def window_pattern(most: int, units: str = "smhd") -> str:
    """Up to `most` seconds, in whole seconds, minutes, hours or days (of `units`; seconds
    may go without their `s`), as a regular expression."""
    return "|".join(
        f"(?:{whole_numbers_up_to(most // UNITS[unit])}){unit}{'?' if unit == 's' else ''}"
        for unit in units
        if most >= UNITS[unit]
    )


# 1 s to 24 h: the schema states it as this pattern, and `window_seconds` reads it with the same one.
WINDOW_PATTERN = window_pattern(MAX_WINDOW)


def window_seconds(value: Any, pattern: str = WINDOW_PATTERN) -> int | None:
    """`value` in seconds when it is a duration `pattern` takes; None when it is not."""
    if not isinstance(value, str) or not re.fullmatch(pattern, value):
        return None
    number = value.rstrip("smhd")  # whole digits, then one unit at most: the pattern matched
    return int(number) * UNITS[value[len(number) :]]


def duration_text(seconds: int) -> str:
    """Seconds as the shortest whole unit: `1d`, `24h` is `1d`, `90` is `90s`."""
    return (
        f"{seconds // 86400}d"
        if seconds % 86400 == 0
        else f"{seconds // 3600}h"
        if seconds % 3600 == 0
        else f"{seconds}s"
    )
