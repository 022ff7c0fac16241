"""JSON that ovpool reads back from its own files (cache manifests, hints, lock holders, serve's
state): whatever a torn, truncated or tampered file holds is a ValueError, as every reader expects
of malformed JSON. json.loads alone raises RecursionError for nesting past its C decoder's guard,
which no reader caught: a worker's start or a probe died of it."""

from __future__ import annotations

import json
from typing import Any


def loads(text: str | bytes) -> Any:
    """``json.loads(text)``, nesting past the decoder's guard a ValueError too."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested deeper than the decoder follows") from None
