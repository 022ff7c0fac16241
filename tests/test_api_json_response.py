"""The API's JSON bodies (ovpool.api.json_response): json.dumps' bytes with the API's options,
non-ASCII as UTF-8, and no NaN or Infinity, which JSON cannot carry."""

from __future__ import annotations

import json
import math

import pytest

from ovpool.api.json_response import JsonResponse


def test_the_bytes_are_json_dumps_with_the_apis_options():
    content = {"text": "é 中 \u2028 \x00 \" \\", "numbers": [1, 2.5, 1e-05, 1e300, -0.0, 2**70],
               "flags": [True, False, None], "nested": {"empty": [], "tuple": (1, "a")}, 7: "int key"}
    expected = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    assert JsonResponse(content).body == expected.encode()


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_a_float_json_cannot_carry_is_refused(number):
    with pytest.raises(ValueError, match="not JSON compliant"):
        JsonResponse({"logprob": number})
