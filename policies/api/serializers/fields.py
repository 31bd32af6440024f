"""Strict scalar fields, and the fields several resources share: a row's name, its version
(the optimistic lock), and core.config's bounded fractions."""

from __future__ import annotations

import math
import sys
from typing import Any

from django.core.validators import MaxValueValidator, RegexValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from policies.invariants import NAME_VALIDATOR
from policies.services.inputs import kind_of

VERSION_HELP = (
    "Optimistic lock: the version you read. Required by PUT and PATCH (409 if the row changed "
    "since); set by the server, so leave it out when creating."
)

# DRF refuses NUL in any string; the schema says so with this pattern.
NO_NUL = RegexValidator(r"\A[^\x00]*\Z", "Null characters are not allowed.")


class StrictCharField(serializers.CharField):
    """A string, and only a string, taken as sent: DRF's CharField would take the number 5
    for "5" and " acme " for "acme", and types are strict here (docs/API.md)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        return super().to_internal_value(a_string(data))


def a_string(data: Any) -> str:
    """`data` if it is a JSON string; else the 400 that says what it is instead."""
    if not isinstance(data, str):
        raise serializers.ValidationError(f"must be a string, not {kind_of(data)}", code="invalid")
    return data


class StrictIntegerField(serializers.IntegerField):
    """A JSON whole number only: DRF's IntegerField would take "3" and 3.0."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    """A finite JSON number only: DRF's FloatField would take "0.5" and true, and fail with
    a 500 on an integer past a float's range."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            self.fail("invalid")
        if isinstance(data, int) and abs(data) > sys.float_info.max or not math.isfinite(data):
            raise serializers.ValidationError("must be a finite number")
        return super().to_internal_value(data)


def name_field(model, **kwargs) -> StrictCharField:
    """A row's name: letters, digits and _ . : - only, as long as the model's column."""
    return StrictCharField(max_length=model._meta.get_field("name").max_length, validators=[NAME_VALIDATOR], **kwargs)


# The largest value a positive integer column holds on every database we run on: PostgreSQL's
# `integer`. Not Django's bound of the connection at hand, which is read when a serializer
# class is made, maybe on another database than the one it serves (SQLite's is 2**63 - 1).
LARGEST_POSITIVE_INTEGER = 2**31 - 1


def largest(model, field: str) -> int:
    """The largest value an integer column takes on every database: Django's bound for it,
    at most PostgreSQL's `integer` (schemathesis found a position of 5.8e13 a 503 there)."""
    bounds = [v.limit_value for v in model._meta.get_field(field).validators if isinstance(v, MaxValueValidator)]
    return min([*bounds, LARGEST_POSITIVE_INTEGER])


def version_field():
    return serializers.IntegerField(min_value=1, required=False, help_text=VERSION_HELP)


# core.config's bounds (parse_fail_modes, parse_priorities), as the schema states them.
@extend_schema_field({"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1})
class FallbackFraction(StrictFloatField):
    """Above 0, at most 1."""


@extend_schema_field({"type": "number", "minimum": 0, "maximum": 1, "exclusiveMaximum": True})
class Watermark(StrictFloatField):
    """From 0 up to (not including) 1."""
