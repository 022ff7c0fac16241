"""A request's body as the HTTP API reads it: JSON, never more than MAX_BODY_BYTES held (413 past it)."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request

from ovpool import errors
from ovpool.api.schema import MAX_BODY_BYTES, parse_json
from ovpool.api.streams import ClientGone


async def read_json(request: Request, empty: bytes | None = None) -> Any:
    """The request's JSON body, read only up to MAX_BODY_BYTES (413 past it); ``empty``: the JSON
    text an empty body stands for (else it is malformed)."""
    # The scope's first content-length (ASGI names are lower case), without building Headers.
    declared = next((value for name, value in request.scope["headers"] if name == b"content-length"), b"")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large()
    chunks, size, receive = [], 0, request.receive
    while True:  # Request.stream()'s loop, without an async generator's cost per request
        message = await receive()
        if message["type"] == "http.disconnect":  # gone before its body was all sent: no answer
            raise ClientGone()
        if message["type"] == "http.request":
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise _too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return parse_json(b"".join(chunks) or empty or b"")


def _too_large() -> HTTPException:
    return HTTPException(413, f"the request body is over {MAX_BODY_BYTES:,} bytes "
                              f"({MAX_BODY_BYTES >> 20} MiB), the most a request may send")


async def admin_body(request: Request) -> dict:
    """An admin route's body: none (``{}``) or a JSON object, read like any request's (read_json)."""
    body = await read_json(request, empty=b"{}")
    if not isinstance(body, dict):
        raise errors.InvalidRequestError("the request body must be a JSON object (or none)")
    return body
