"""The OpenAPI schema as the live policy makes it: drf-spectacular's postprocessing hooks.

Some fields can only hold names the database has configured: a decision's `keys` and a rule
set are keyed by level name, a priority class lists levels, a tenant and the default tier
name a tier, a decision may name a priority class, the buckets' `level` is a level, a what-if
draft is keyed by tier, tenant and priority class. Such a field carries a marker
(`names_of("level")`, `keyed_by_level(...)`, `keyed_by("tier", ...)`), and `live_policy_names`
turns each marker into the names configured when the schema is asked for: the schema is
generated per request, so schema-valid data is valid data, and the schema changes as soon as
the policy does.

The names are policy settings, told only to callers that may use them: levels and priority
classes to any caller that may decide, tiers and tenants (up to MOST_TENANTS_NAMED) to
operators. An anonymous caller, and a schema written offline (`manage.py spectacular`, which
has no request), get the static shape, where a name is any non-empty string.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from policies.models import Level, PriorityClass, Tenant, Tier

from .auth import CanDecide, IsOperator

NAMES = "x-policy-names"  # on a string: one of the configured names of a kind
KEYED = "x-keyed-by-level"  # on an object: its keys are configured level names
NOT_EMPTY = "x-some-level-not-empty"  # on such an object: some level holds a non-empty list
KEYED_BY = "x-keyed-by"  # on an object: its keys are configured names of a kind ("tier", "tenant", ...)
# Past this many tenants the live schema leaves a tenant-keyed object's keys free (any team key).
MOST_TENANTS_NAMED = 1000
METHODS = ("get", "put", "patch", "post", "delete", "head", "options", "trace")
REF_PREFIX = "#/components/schemas/"


def names_of(kind: str) -> dict:
    """The schema of a string that must be a configured name: "level", "tier" or "priority"."""
    return {"type": "string", "minLength": 1, NAMES: kind}


def keyed_by(kind: str, value: dict, **more: Any) -> dict:
    """The schema of an object whose keys are configured names of `kind`, each holding `value`."""
    return {"type": "object", "additionalProperties": value, KEYED_BY: kind, **more}


def keyed_by_level(value: dict, not_empty: bool = False, **more: Any) -> dict:
    """The schema of an object keyed by configured level names, each holding `value`;
    `not_empty`: the values are lists, and one of them at least must hold something."""
    marks = {KEYED: True, NOT_EMPTY: True} if not_empty else {KEYED: True}
    return {"type": "object", "additionalProperties": value, **marks, **more}


# The hooks -------------------------------------------------------------------------------------


def strict_request_bodies(result: dict, generator, request, public, **kwargs) -> dict:
    """Every body the API reads refuses unknown fields (a typo is a 400, docs/API.md), so every
    object in a request body's schema says `additionalProperties: false`."""
    schemas = result.get("components", {}).get("schemas", {})
    for name in request_components(result):
        _forbid_unknown_fields(schemas[name])
    for media in _request_media(result):
        _forbid_unknown_fields(media.get("schema"))
    return result


def live_policy_names(result: dict, generator, request, public, **kwargs) -> dict:
    """Each marked field as the configured names make it, on request bodies and parameters;
    responses keep the static shape (a name in an answer is whatever was configured then)."""
    names = configured_names(request)
    requested = request_components(result)
    for name, schema in result.get("components", {}).get("schemas", {}).items():
        _fill(schema, names if name in requested else {})
    for media in _request_media(result):
        _fill(media.get("schema"), names)
    for operation in _operations(result):
        for parameter in operation.get("parameters", []):
            _fill(parameter.get("schema"), names)
    return result


def configured_names(request) -> dict[str, list[str]]:
    """The names the caller of `request` may be told, by kind; none without a caller. Three
    small queries: the schema is generated per request anyway."""
    if request is None or not CanDecide().has_permission(request, None):
        return {}
    names = {
        "level": list(Level.objects.values_list("name", flat=True)),  # in evaluation order
        "priority": list(PriorityClass.objects.values_list("name", flat=True)),
    }
    if IsOperator().has_permission(request, None):
        names["tier"] = list(Tier.objects.values_list("name", flat=True))
        tenants = list(Tenant.objects.order_by("key").values_list("key", flat=True)[: MOST_TENANTS_NAMED + 1])
        if len(tenants) <= MOST_TENANTS_NAMED:
            names["tenant"] = tenants
    return names


# Walking the schema -----------------------------------------------------------------------------


def request_components(result: dict) -> set[str]:
    """The component schemas that request bodies use, directly or through other components."""
    schemas = result.get("components", {}).get("schemas", {})
    found: set[str] = set()
    todo = [media.get("schema") for media in _request_media(result)]
    while todo:
        for ref in _refs(todo.pop()):
            name = ref.removeprefix(REF_PREFIX)
            if name not in found and name in schemas:
                found.add(name)
                todo.append(schemas[name])
    return found


def _operations(result: dict) -> Iterator[dict]:
    for item in result.get("paths", {}).values():
        for method in METHODS:
            if method in item:
                yield item[method]


def _request_media(result: dict) -> Iterator[dict]:
    for operation in _operations(result):
        yield from operation.get("requestBody", {}).get("content", {}).values()


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _forbid_unknown_fields(node: Any) -> None:
    if isinstance(node, list):
        for value in node:
            _forbid_unknown_fields(value)
    elif isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            _forbid_unknown_fields(value)


def _fill(node: Any, names: dict[str, list[str]]) -> None:
    """Turn the markers in `node` into the names they stand for; a marker whose kind is not
    in `names` is dropped, leaving the static shape."""
    if isinstance(node, list):
        for value in node:
            _fill(value, names)
        return
    if not isinstance(node, dict):
        return
    kind = node.pop(NAMES, None)
    if kind in names:
        _enumerate(node, names[kind])
    keyed_by_kind = node.pop(KEYED_BY, None)
    if keyed_by_kind in names:
        value = node["additionalProperties"]
        node["properties"] = {name: copy.deepcopy(value) for name in names[keyed_by_kind]}
        node["additionalProperties"] = False
    not_empty = node.pop(NOT_EMPTY, False)
    if node.pop(KEYED, False) and "level" in names:
        levels = names["level"]
        value = node["additionalProperties"]
        node["properties"] = {level: copy.deepcopy(value) for level in levels}
        node["additionalProperties"] = False
        if not_empty:
            some = [{"required": [level], "properties": {level: {"type": "array", "minItems": 1}}} for level in levels]
            if some:
                node["anyOf"] = some
            else:
                node["not"] = {}
        if isinstance(node.get("example"), dict) and not set(node["example"]) <= set(levels):
            del node["example"]  # it names a level that is not configured
    for value in node.values():
        _fill(value, names)


def _enumerate(node: dict, names: list[str]) -> None:
    # OpenAPI 3.0 lists null among the values of a nullable enum. An enum may not be empty:
    # with nothing configured, no string is valid, which `not: {}` says.
    allowed = [*names, None] if node.get("nullable") else list(names)
    if allowed:
        node["enum"] = allowed
    else:
        node["not"] = {}
