"""ovpool's error tree as OpenAI's error JSON and HTTP statuses, mapped once.

``{"error": {"message", "type", "param", "code"}}``; the class decides the status (its nearest
ancestor in the table below), so a new subclass maps like its parent.
"""

from __future__ import annotations

from typing import Any

from ovpool import errors

# Seconds a client told "queue full" waits before it retries (the SDK honours Retry-After).
RETRY_AFTER_S = 1

# class -> (HTTP status, OpenAI error type, OpenAI code or None for ovpool's wire code).
_TABLE: dict[type, tuple[int, str, str | None]] = {
    errors.InvalidRequestError: (400, "invalid_request_error", None),
    errors.UnauthorizedError: (401, "invalid_request_error", "invalid_api_key"),
    errors.ModelNotFoundError: (404, "invalid_request_error", "model_not_found"),
    errors.QueueFullError: (429, "rate_limit_error", None),
    errors.WorkerLostError: (503, "server_error", None),  # the model's workers are gone
    errors.BrokerUnavailableError: (503, "server_error", None),
    errors.DrainingError: (503, "server_error", None),  # shutting down or restarting: retry
    errors.CancelledError: (503, "server_error", None),  # cancelled by the pool, not this client
    errors.AuthenticationError: (503, "server_error", None),  # the broker refused this API's CURVE key
    errors.RequestTimeoutError: (504, "timeout", None),
    errors.OvpoolError: (500, "server_error", None),
}


def classify(exc: errors.OvpoolError) -> tuple[int, str, str]:
    """(HTTP status, OpenAI type, code) for ``exc``."""
    for cls in type(exc).__mro__:
        if cls in _TABLE:
            status, kind, code = _TABLE[cls]
            return status, kind, code or exc.code
    raise TypeError(f"{type(exc).__name__} is not an ovpool error")  # unreachable: OvpoolError is listed


def body(exc: errors.OvpoolError) -> dict[str, Any]:
    _, kind, code = classify(exc)
    return {"error": {"message": str(exc), "type": kind, "param": getattr(exc, "param", None), "code": code}}


def headers(exc: errors.OvpoolError) -> dict[str, str]:
    status = classify(exc)[0]
    if status == 429 or isinstance(exc, errors.DrainingError):
        return {"Retry-After": str(RETRY_AFTER_S)}
    if status == 401:
        return {"WWW-Authenticate": "Bearer"}
    return {}


def http_body(status: int, message: str) -> dict[str, Any]:
    """An error of the HTTP layer itself (unknown route, wrong method) in the same JSON."""
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": status}}

