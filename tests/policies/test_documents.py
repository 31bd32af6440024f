"""policies.documents: how deeply a document from outside may nest, counted without recursion."""

import json

import pytest

from policies.documents import MAX_DEPTH, BoundedJSONDecoder, too_deep


def nested(depth: int) -> list:
    doc: list = []
    for _ in range(depth - 1):
        doc = [doc]
    return doc


@pytest.mark.parametrize(
    ("doc", "depth"), [(5, 0), ("[[[", 0), ([], 1), ({"a": [1, {"b": None}]}, 3), (nested(64), 64)]
)
def test_a_document_as_deep_as_the_limit_is_not_too_deep(doc, depth):
    assert not too_deep(doc, limit=depth)
    assert depth == 0 or too_deep(doc, limit=depth - 1)


def test_the_deepest_branch_counts_however_wide_the_others_are():
    wide = {"requests": [{"keys": {"user": f"u{i}"}} for i in range(1000)], "deep": nested(MAX_DEPTH)}
    assert too_deep(wide)
    del wide["deep"]
    assert not too_deep(wide)


def test_a_list_inside_itself_is_too_deep_and_the_count_ends():
    loop: list = []
    loop.append(loop)
    assert too_deep(loop)


@pytest.mark.parametrize("text", ["[" * 65 + "]" * 65, "[" * 100_000 + "]" * 100_000])
def test_the_bounded_decoder_refuses_as_json_refuses_bad_json(text):
    with pytest.raises(json.JSONDecodeError, match="nested more than 64 levels deep"):
        json.loads(text, cls=BoundedJSONDecoder)
    assert json.loads("[" * 64 + "]" * 64, cls=BoundedJSONDecoder) == nested(64)
