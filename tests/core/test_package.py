"""The engine stands on its own: its code, tests and benchmarks explain themselves rather than
point at documents that are not in this repository."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What a pointer to an outside document looks like: the project's specification by name, or
# one of the numbered example briefs it came with.
OUTSIDE_DOCUMENTS = re.compile(r"SPEC\.md|\bseeds? (?:0\d\d|and)\b|\bseed-\d|\bthe specification\b", re.IGNORECASE)


def python_files():
    for folder in ("core", "tests/core", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path != Path(__file__).resolve():
                yield path


def test_no_docstring_or_comment_points_at_a_document_outside_the_repository():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in python_files()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if OUTSIDE_DOCUMENTS.search(line)
    ]
    assert found == []
