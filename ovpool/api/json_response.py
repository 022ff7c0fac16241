"""Starlette's JSONResponse with its encoder built once.

Starlette's ``render`` calls ``json.dumps`` with keyword arguments, and ``dumps`` builds a fresh
JSONEncoder for every call made with any, whose ``encode`` builds a fresh C encoder in turn; this
one builds the C encoder once with the same options (non-ASCII as UTF-8, NaN refused, no spaces),
so the bytes are the same. It skips the circular-reference check (a response is built of fresh
dicts and lists; a cycle would be a RecursionError instead of a ValueError).
"""

from __future__ import annotations

import json
from json.encoder import c_make_encoder, encode_basestring
from typing import Any

from starlette.responses import JSONResponse

_encoder = c_make_encoder(None, json.JSONEncoder().default, encode_basestring, None, ":", ",", False, False,
                          False)


class JsonResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return "".join(_encoder(content, 0)).encode("utf-8")
