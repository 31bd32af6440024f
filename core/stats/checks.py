"""The statistics' checks, each error naming its field: options when the statistics are made
(ConfigError), and the arguments of a report or a usage when asked (InvalidRequest)."""

from __future__ import annotations

import math
from typing import Any

from ..errors import ConfigError, InvalidRequest
from .layout import HOUR, MINUTE, Bounds

STEPS = (MINUTE, HOUR)  # a tenant's series: per minute or per hour


def check_options(top_k: Any, retention: Any, flush_every: Any, minutes: Any, hours: Any, user_top_k: Any) -> None:
    for name, value in (("top_k", top_k), ("user_top_k", user_top_k)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"must be a whole number of at least 1, got {value!r}", name)
    for name, value, least in (("retention", retention, MINUTE), ("usage_minutes", minutes, MINUTE)):
        if not _is_number(value) or not least <= value < math.inf:
            raise ConfigError(f"must be at least {least} seconds, got {value!r}", name)
    if not _is_number(hours) or not HOUR <= hours < math.inf:
        raise ConfigError(f"must be at least {HOUR} seconds, got {hours!r}", "usage_hours")
    if flush_every is not None and (not _is_number(flush_every) or not 0 < flush_every < math.inf):
        raise ConfigError(f"must be seconds, more than 0, or None, got {flush_every!r}", "flush_every")


def check_report(window: Any, top: Any, step: Any, bounds: Bounds) -> tuple[float, int, int]:
    """A report's window, top and step (None: a minute)."""
    window = _check_window(window, bounds.retention)
    top = _check_whole(top, "top", 1, bounds.top_k)
    return window, top, MINUTE if step is None else _check_step(step, bounds.retention)


def check_usage(window: Any, step: Any, top: Any, bounds: Bounds) -> tuple[float, int, int]:
    """A usage's window, step and top; the window may reach back as far as its step is kept."""
    if isinstance(step, bool) or step not in STEPS:
        raise InvalidRequest(f"must be 60 (a minute) or 3600 (an hour), got {step!r}", "step")
    step = int(step)
    window = _check_window(window, bounds.usage_minutes if step == MINUTE else bounds.usage_hours)
    return window, step, _check_whole(top, "top", 1, bounds.user_top_k)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_window(window: Any, retention: float) -> float:
    if not _is_number(window) or not 0 < window <= retention:  # also refuses NaN
        raise InvalidRequest(f"must be seconds, more than 0 and at most {retention:g}, got {window!r}", "window")
    return window


def _check_step(step: Any, retention: float) -> int:
    if not _is_number(step) or not MINUTE <= step <= retention or step % MINUTE:
        raise InvalidRequest(f"must be a whole number of minutes in seconds (60, 900, ...), got {step!r}", "step")
    return int(step)


def _check_whole(value: Any, name: str, least: int, most: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= most:
        raise InvalidRequest(f"must be a whole number from {least} to {most}, got {value!r}", name)
    return value
