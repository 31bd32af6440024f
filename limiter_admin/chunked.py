"""Request bodies sent in chunks (`Transfer-Encoding: chunked`, no Content-Length), read.

Django reads a body only as far as CONTENT_LENGTH (WSGIRequest wraps `wsgi.input` in a
LimitedStream of that many bytes: none when it is absent), and DRF reads none without it: a
chunked `POST /api/v1/decisions` read as empty, "keys: this field is required" (issue 26).
PEP 3333 lets an application read no further than CONTENT_LENGTH, since the input may go on
past the body; a server whose input ends where the body does says so with
`wsgi.input_terminated` (gunicorn, which takes the chunks apart, sets it on every request).

`ChunkedBodies` wraps the WSGI application (limiter_admin/wsgi.py). Given a chunked body on
a terminated input, it reads the body to its end, at most DATA_UPLOAD_MAX_MEMORY_SIZE + 1
bytes, and hands it on with its CONTENT_LENGTH, as if it had come with one: every view reads
it as it reads any body, and one longer than the limit is refused as any is (Django's
RequestDataTooBig: the API's 400 `malformed_request`). On an input that is not terminated
(Django's runserver) the body cannot be read safely: a 411 says to send a Content-Length.

The trade-off: a chunked body is held in memory, up to the limit, before a view runs, and a
chunked upload of a file larger than the limit is refused where Django would have spooled it
to disk. Nothing here takes uploads.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings

from policies.services.errors import error_body

STEP = 64 * 1024  # bytes asked of the input at a time
LENGTH_REQUIRED = (
    "this server cannot read a chunked body (Transfer-Encoding: chunked) to its end: send a "
    "Content-Length, or serve with gunicorn"
)


class ChunkedBodies:
    """A WSGI application: `application`, with chunked bodies read (see the module)."""

    def __init__(self, application: Callable[..., Iterable[bytes]]) -> None:
        self.application = application

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if "HTTP_TRANSFER_ENCODING" in environ and not environ.get("CONTENT_LENGTH"):
            if not environ.get("wsgi.input_terminated"):
                return length_required(start_response)
            body = read_body(environ["wsgi.input"], settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
            environ["wsgi.input"] = io.BytesIO(body)
            environ["CONTENT_LENGTH"] = str(len(body))
        return self.application(environ, start_response)


def read_body(stream: Any, limit: int | None) -> bytes:
    """`stream` to its end, or its first `limit` + 1 bytes: enough for Django to tell that the
    body is larger than `limit` (None: no limit, as Django reads it)."""
    parts: list[bytes] = []
    size = 0
    while limit is None or size <= limit:
        part = stream.read(STEP if limit is None else min(STEP, limit + 1 - size))
        if not part:
            break
        parts.append(part)
        size += len(part)
    return b"".join(parts)


def length_required(start_response: Callable[..., Any]) -> list[bytes]:
    """411, in the API's error shape."""
    content = json.dumps(error_body("length_required", LENGTH_REQUIRED)).encode()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(content)))]
    start_response("411 Length Required", headers)
    return [content]
