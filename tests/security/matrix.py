"""The authorization matrix of docs/SECURITY.md, read from the document itself, and the
project's endpoints, read from the URL resolver and the OpenAPI schema.

The document's table has one row per route (as the resolver spells it) and the methods it
takes, and one column per caller. The test asks every cell and compares the answer's class:

    yes     served: 2xx, a redirect that is not to the login page, or an answer about the
            request itself (400, 404, 409); never 401 or 403
    401     refused for want of valid credentials (the API's Bearer challenge)
    403     refused: the credentials are valid but not enough
    login   sent to the admin's login page (302 to /admin/login/?next=...)

Admin pages that every model has are one row each, with `<app>/<model>` in their path, and
are asked for every registered model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from django.contrib import admin
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.resolvers import RegexPattern

SECURITY_MD = Path(__file__).resolve().parents[2] / "docs" / "SECURITY.md"
CALLERS = ("anonymous", "decide token", "admin token", "revoked token", "staff session", "non-staff session")
OUTCOMES = {"yes", "401", "403", "login"}
MODEL_PREFIX = "/admin/<app>/<model>/"


# --- the document's table ------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    methods: tuple[str, ...]
    path: str
    expected: dict[str, str]  # caller -> outcome

    def __str__(self):
        return f"{' '.join(self.methods)} {self.path}"


def read_table(text: str | None = None) -> list[Row]:
    """The rows of the table whose header starts `| methods | path |`."""
    lines = (SECURITY_MD.read_text() if text is None else text).splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(r"\|\s*methods\s*\|\s*path\s*\|", line)), None)
    if start is None:
        raise AssertionError(f"{SECURITY_MD} has no table whose header starts `| methods | path |`")
    header = _cells(lines[start])
    assert tuple(header[2:]) == CALLERS, f"the table's callers are {header[2:]}, expected {list(CALLERS)}"
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = _cells(line)
        assert len(cells) == len(header), f"a row of {len(cells)} cells, not {len(header)}: {line}"
        expected = dict(zip(CALLERS, cells[2:]))
        unknown = {value for value in expected.values() if value not in OUTCOMES}
        assert not unknown, f"unknown outcome {unknown} in: {line} (known: {sorted(OUTCOMES)})"
        rows.append(Row(tuple(cells[0].split()), cells[1], expected))
    return rows


def _cells(line: str) -> list[str]:
    return [cell.strip().strip("`").strip() for cell in line.strip().strip("|").split("|")]


# --- the project's endpoints ---------------------------------------------------------------


def registered_models() -> dict[str, type]:
    """`app/model/` -> model, for every model the admin shows."""
    return {f"{model._meta.app_label}/{model._meta.model_name}/": model for model in admin.site._registry}


def routes() -> dict[str, list]:
    """Every route, spelled as the table spells it -> the models it serves (admin model
    pages: one route for all models) or [None]."""
    found: dict[str, list] = {}
    models = registered_models()

    def walk(patterns, prefix: str, model) -> None:
        for pattern in patterns:
            part = _readable(pattern.pattern)
            if isinstance(pattern, URLResolver):
                if prefix == "/admin/" and part in models:
                    walk(pattern.url_patterns, MODEL_PREFIX, models[part])
                else:
                    walk(pattern.url_patterns, prefix + part, model)
            elif isinstance(pattern, URLPattern):
                found.setdefault(prefix + part, []).append(model)

    walk(get_resolver().url_patterns, "/", None)
    return found


def _readable(pattern) -> str:
    """A route as written (`tiers/<str:name>`); a regex with its groups as `<name>` or `<…>`."""
    text = str(pattern)
    if not isinstance(pattern, RegexPattern):
        return text
    text = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"<\1>", text.lstrip("^").rstrip("$"))
    return re.sub(r"\([^)]*\)", "<…>", text)


def schema_operations() -> dict[str, set[str]]:
    """The OpenAPI schema's paths, spelled as routes (`/api/v1/tiers/<str:name>`) -> methods."""
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    by_schema_path = {re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route): route for route in routes()}
    operations = {}
    for path, item in schema["paths"].items():
        route = by_schema_path.get(path, path)
        operations[route] = {method.upper() for method in item if method in ("get", "put", "patch", "post", "delete")}
    return operations


# --- answers -------------------------------------------------------------------------------


def outcome(response) -> str:
    """The class of an answer, as the table's cells name them; anything else as its status."""
    status = response.status_code
    if status in (301, 302, 303, 307, 308):
        return "login" if response["Location"].startswith("/admin/login/") else "yes"
    if status in (401, 403):
        return str(status)
    if 200 <= status < 300 or status in (400, 404, 409):
        return "yes"
    return str(status)
