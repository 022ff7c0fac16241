"""API keys of the HTTP API, sent as ``Authorization: Bearer <key>`` (OpenAI's SDKs) or
``x-api-key: <key>`` (Anthropic's): several may be valid at once (rotation), each compared in
constant time. No key configured: open, which is fine on loopback; elsewhere it is logged."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable

from ovpool.auth import is_loopback
from ovpool.errors import UnauthorizedError

log = logging.getLogger(__name__)


def parse(values: Iterable[str]) -> list[str]:
    """Keys from repeated ``--api-key`` values and/or comma-separated ``OVPOOL_API_KEY``."""
    return [key.strip() for value in values for key in value.split(",") if key.strip()]


class ApiKeys:
    def __init__(self, keys: Iterable[str] = ()):
        self._keys = [key.encode() for key in keys]

    def __bool__(self) -> bool:
        return bool(self._keys)

    def check(self, authorization: str | None, api_key: str | None = None) -> None:
        """Raise UnauthorizedError unless ``authorization`` is ``Bearer <a valid key>`` or, when
        there is no Authorization header, ``api_key`` (the x-api-key header) is a valid key."""
        if not self._keys:
            return
        scheme, _, presented = (authorization or "").partition(" ")
        if authorization is None and api_key:
            scheme, presented = "bearer", api_key
        if scheme.lower() != "bearer" or not presented.strip():
            raise UnauthorizedError("missing API key: send the header 'Authorization: Bearer <key>' "
                                    "(or 'x-api-key: <key>')")
        candidate = presented.strip().encode()
        matched = False
        for key in self._keys:  # every key, no early exit: the time does not say which one matched
            matched |= hmac.compare_digest(candidate, key)
        if not matched:
            raise UnauthorizedError("invalid API key")

    def warn_if_open(self, host: str) -> None:
        if not self._keys and not is_loopback(f"tcp://[{host}]:0" if ":" in host else f"tcp://{host}:0"):
            log.warning("HTTP API on %s without an API key: anyone who can reach it can submit requests;"
                        " set --api-key or OVPOOL_API_KEY", host)
