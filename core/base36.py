"""Whole numbers written in base 36: short key parts for Redis and the statistics."""

from __future__ import annotations

DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def base36(number: int) -> str:
    """`number` (0 or more) in base 36, lower case; `int(text, 36)` reads it back."""
    out = ""
    while True:
        number, digit = divmod(number, 36)
        out = DIGITS[digit] + out
        if not number:
            return out
