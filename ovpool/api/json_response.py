"""Starlette's JSONResponse with its encoder built once.

Starlette's ``render`` calls ``json.dumps`` with keyword arguments, and ``dumps`` builds a fresh
JSONEncoder for every call made with any; this one reuses an encoder of the same options
(non-ASCII as UTF-8, NaN refused, no spaces), so the bytes are the same.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode


class JsonResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return _encode(content).encode("utf-8")
