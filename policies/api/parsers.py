"""A JSON parser that reads the body in one go.

DRF's JSONParser decodes the body through a codecs stream reader, which costs a decision about
20 us; `json.loads` on the bytes costs 2. Same strictness: NaN and Infinity are not JSON.
"""

import json

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from policies.documents import MAX_DEPTH, TOO_DEEP, too_deep


def _refuse_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def loads(raw: bytes):
    """A JSON document from its bytes; ParseError (a 400) when it is not one, or when it nests
    more than MAX_DEPTH levels deep (policies.documents): refused here, before any field is
    read, so that nothing after the parser recurses that deep."""
    try:
        doc = json.loads(raw, parse_constant=_refuse_constant)
    except ValueError as error:  # also UnicodeDecodeError
        raise ParseError(f"JSON parse error - {error}") from None
    except RecursionError:  # nesting deeper than Python's stack (about 1,000 levels)
        raise ParseError(f"JSON parse error - {TOO_DEEP}") from None
    # Counting brackets costs a decision 0.1 us; walking the document, a batch of 1,000 about
    # 400 (a tenth of a microsecond per decision): only a body with more brackets than
    # levels allowed can be too deep.
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and too_deep(doc):
        raise ParseError(f"JSON parse error - {TOO_DEEP}")
    return doc


class FastJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        return loads(stream.read())


def read_json(request):
    """A Django request's JSON body, as DRF's `request.data` reads it: {} when there is
    none; else the parsers' reading of it (ParseError when it is not JSON)."""
    raw = request.body
    return loads(raw) if raw else {}
