"""Read settings from the environment, failing at start-up on a value we cannot read."""

import json
import os

from django.core.exceptions import ImproperlyConfigured

TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}


def env_bool(name, default):
    """The boolean in environment variable `name`, or `default` when it is unset."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    # A typo such as DEBUG=O must not silently leave debug mode on (or off).
    raise ImproperlyConfigured(f"{name}={raw!r}: expected 1 or 0")


def env_list(name, default):
    """The comma-separated list in `name` (blank items dropped), or `default` when unset."""
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_str(name, default=None):
    """The string in `name`; an empty value counts as unset."""
    return os.environ.get(name) or default


def env_int(name, default, minimum=None):
    """The whole number in `name`, or `default` when it is unset or empty; one below `minimum`
    (when given) is refused."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r}: expected a whole number") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r}: expected a whole number from {minimum}")
    return value


def env_json(name, default):
    """The JSON document in `name`, or `default` when it is unset or empty."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return json.loads(raw)
    except ValueError as error:
        raise ImproperlyConfigured(f"{name}: not JSON ({error})") from None


def env_number(name, default):
    """The number in `name` (`2`, `0.5`, `1e3`), or `default` when it is unset or empty. Its
    range is for a system check to judge (policies.checks)."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r}: expected a number") from None
