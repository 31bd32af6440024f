"""How deeply a document read from outside may nest: a request's JSON body, a policy file, the
admin's JSON parameters.

Python's json and yaml parsers recurse once per level, and so does much of what reads their
output (Django's ORM lookups, DRF's validation, json.dumps, repr): a document some hundreds of
levels deep ended in a RecursionError wherever the stack ran out first (issue 26: a 500). No
policy document nests more than six levels, so one nested more than MAX_DEPTH is refused
where it is read, the same way whatever reads it next.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64
TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep"

_CONTAINERS = (dict, list)


def too_deep(doc: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `doc` nests lists and dicts more than `limit` levels deep ([] is one level,
    [[]] two). Level by level, without recursion; a list inside itself is too deep."""
    level = [doc] if isinstance(doc, _CONTAINERS) else []
    for _ in range(limit):
        if not level:
            return False
        below: list = []
        for node in level:
            for item in node.values() if isinstance(node, dict) else node:
                if isinstance(item, _CONTAINERS):
                    below.append(item)
        level = below
    return bool(level)


class BoundedJSONDecoder(json.JSONDecoder):
    """Python's JSON decoder, refusing a document nested more than MAX_DEPTH levels deep with
    the JSONDecodeError any bad JSON gets: for Django's `forms.JSONField(decoder=...)`, which
    decodes with it both to clean a field and to show it again."""

    def decode(self, s: str, *args: Any, **kwargs: Any) -> Any:
        try:
            doc = super().decode(s, *args, **kwargs)
            if not too_deep(doc):
                return doc
        except RecursionError:  # deeper than Python's stack: too deep as well
            pass
        raise json.JSONDecodeError(TOO_DEEP, s, 0)
