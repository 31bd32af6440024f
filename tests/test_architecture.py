"""The house's layers (docs/ARCHITECTURE.md) hold: the import-linter contracts of pyproject.toml,
and the rules no contract can state: no first-party import inside a function unless a comment
says why, no underscore name imported from another module, and decisions built in one place."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "policies", "limiter_admin")
FIRST_PARTY = (*PACKAGES, "tests", "bench")


def sources() -> list[Path]:
    return sorted(
        path for package in PACKAGES for path in (ROOT / package).rglob("*.py") if "migrations" not in path.parts
    )


def imported_modules(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        return ["." * node.level + (node.module or "")]
    return [alias.name for alias in node.names]


def is_first_party(name: str) -> bool:
    return name.startswith(".") or name.split(".")[0] in FIRST_PARTY


def inner_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports inside a function's body (at any depth)."""
    found = []
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [node for node in ast.walk(function) if isinstance(node, (ast.Import, ast.ImportFrom))]
    return found


def test_the_import_linter_contracts_hold():
    linted = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert linted.returncode == 0, linted.stdout[-4000:] + linted.stderr[-2000:]


# What an HTTP transport imports of Django, which a transport-free module must not.
HTTP_MODULES = ("django.http", "django.views", "django.template", "django.shortcuts", "django.urls", "rest_framework")


def test_the_services_know_no_http():
    found = []
    for path in sorted((ROOT / "policies" / "services").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found += [
                    f"{path.relative_to(ROOT)}:{node.lineno}: {name}"
                    for name in imported_modules(node)
                    if name.startswith(HTTP_MODULES)
                ]
    assert not found, "the service layer imports HTTP machinery:\n" + "\n".join(found)


def test_a_first_party_import_inside_a_function_says_why():
    unexplained = []
    for path in sources():
        lines = path.read_text().splitlines()
        for node in inner_imports(ast.parse(path.read_text())):
            if not any(map(is_first_party, imported_modules(node))):
                continue
            said = "#" in lines[node.lineno - 1] or lines[node.lineno - 2].strip().startswith("#")
            if not said:
                unexplained.append(f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not unexplained, "imports inside functions without a comment saying why:\n" + "\n".join(unexplained)


def test_no_module_imports_another_modules_underscore_name():
    found = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and is_first_party("." * node.level + (node.module or "")):
                private = [alias.name for alias in node.names if alias.name.startswith("_")]
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in private]
    assert not found, "underscore names imported from another module:\n" + "\n".join(found)


def test_decisions_are_built_positionally_only_in_core_decision():
    users = [
        str(path.relative_to(ROOT))
        for path in sources()
        if "tuple.__new__" in path.read_text() and path != ROOT / "core" / "decision.py"
    ]
    assert not users, f"tuple.__new__ outside core/decision.py: {users}"


def test_generated_code_builds_its_decision_from_decision_py_and_names_its_file():
    """Generated code (the in-process store's lean decide) takes its decision expression from
    core/decision.py, which derives it from Decision's fields, and is compiled under a file
    name of its own with its source in linecache, so that its tracebacks show where."""
    generators = [path for path in sources() if "exec(" in path.read_text()]
    assert generators == [ROOT / "core" / "stores" / "memory.py"]
    for path in generators:
        text = path.read_text()
        assert "inline_allowed(" in text and "exec(compile(source, filename" in text and "linecache.cache[" in text


def test_the_probe_finds_what_it_looks_for(tmp_path):
    """The checks above read what they claim to: an unexplained inner import is found."""
    tree = ast.parse("def f():\n    from policies import models\n    return models\n")
    [node] = inner_imports(tree)
    assert imported_modules(node) == ["policies"] and is_first_party("policies")
