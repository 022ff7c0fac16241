"""Server-sent events as OpenAI frames them: ``data: <json>`` and a blank line per event, the
stream closed by ``data: [DONE]``; a failure after the first token is an ``{"error": ...}`` event."""

from __future__ import annotations

import json
from typing import Any

from ovpool import errors
from ovpool.api import errors as api_errors

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy buffering (nginx)

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def data(obj: Any) -> bytes:
    return b"data: " + _dumps(obj).encode() + b"\n\n"


def error(exc: errors.OvpoolError) -> bytes:
    return data(api_errors.body(exc))
