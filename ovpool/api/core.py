"""The HTTP API's core: its Config, and Api, the routes' state (the broker client, metrics, the
drain) with ``serve``, the path every route shares: key check, errors in the dialect's JSON, and the
request's metrics. The routes (generation.py, operations.py) are composed with one Api; app.py
builds the Starlette app around them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ovpool import errors, timing
from ovpool.api import errors as api_errors
from ovpool.api import sse
from ovpool.api.dialect import ErrorShape
from ovpool.api.json_response import JsonResponse
from ovpool.api.keys import ApiKeys
from ovpool.api.metrics import ApiMetrics
from ovpool.api.streams import ClientGone, Disconnects
from ovpool.async_client import AsyncClient

log = logging.getLogger(__name__)

_CLIENT_CLOSED = 499  # nginx's status for "the client closed the connection first", in metrics only


@dataclass
class Config:
    broker: str
    settings: Any
    keys: ApiKeys
    max_tokens: int  # a chat request's default max_tokens (the pool's max_new_tokens)
    status_timeout_s: float = 5.0
    shutdown_timeout_s: float = 30.0  # a drain: how long requests in flight may run on
    max_connections: int = 1024  # open client connections (server.run refuses more)


def http_response(exc: HTTPException, shape: ErrorShape) -> JsonResponse:
    return JsonResponse(shape.http_body(exc.status_code, exc.detail), exc.status_code)


def error_response(exc: errors.OvpoolError, shape: ErrorShape) -> JsonResponse:
    return JsonResponse(shape.body(exc), api_errors.classify(exc)[0], api_errors.headers(exc))


class Api:
    """The routes' state (the broker client, metrics, the drain) and the path every route shares,
    ``serve``; the routes themselves are in generation.py and operations.py, composed with it."""

    def __init__(self, config: Config):
        self.config = config
        self.metrics = ApiMetrics()
        self.client: AsyncClient | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.disconnects = Disconnects()
        self.draining = False  # server.run's drain: new requests get 503 + Retry-After
        self.in_flight = 0  # requests between their key check and their last byte

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        async with AsyncClient(self.config.broker, settings=self.config.settings) as client:
            self.client, self.loop = client, asyncio.get_running_loop()  # server.run drains on it
            tasks = [asyncio.create_task(self.disconnects.run()), asyncio.create_task(self._watch(app))]
            try:
                yield
            finally:
                for task in tasks:
                    task.cancel()
        self.client = None

    async def _watch(self, app: Starlette) -> None:
        """Record why the broker client stopped reading, should it ever (server.run then exits)."""
        while self.client.healthy:
            await asyncio.sleep(timing.POLL_INTERVAL_S)
        await asyncio.sleep(0)  # the ended task's done callback, which records why, runs first
        app.state.link_lost = self.client.link_state().stopped or "its I/O loop ended"
        log.error("the HTTP API's broker client stopped: %s; exiting so a fresh process takes over",
                  app.state.link_lost)

    # -- the shared path ------------------------------------------------------------------------

    async def serve(self, request: Request, endpoint: str, handler: Callable[[Request], Awaitable[Response]],
                     shape: ErrorShape = api_errors) -> Response:
        """Key check, the handler, its errors in ``shape``'s JSON, and the request's metrics."""
        started = request.state.started = time.perf_counter()
        self.in_flight += 1
        try:
            if self.config.keys:  # none configured: its headers need not be parsed
                self.config.keys.check(request.headers.get("authorization"), request.headers.get("x-api-key"))
            if self.draining and endpoint != "admin":
                raise errors.DrainingError("this HTTP API is draining (it is stopping) and takes no new"
                                           " request; retry in a moment or on another replica")
            response = await handler(request)
        except errors.OvpoolError as exc:
            response = error_response(exc, shape)
        except HTTPException as exc:  # a body over MAX_BODY_BYTES
            response = http_response(exc, shape)
        except ClientGone:
            self.in_flight -= 1
            self.metrics.finished(endpoint, _CLIENT_CLOSED, time.perf_counter() - started)
            return Response(status_code=_CLIENT_CLOSED)
        except BaseException:
            self.in_flight -= 1
            raise
        if isinstance(response, StreamingResponse):
            response.body_iterator = self._timed(response.body_iterator, endpoint, started)
        else:
            self.in_flight -= 1
            self.metrics.finished(endpoint, response.status_code, time.perf_counter() - started)
        return response

    async def _timed(self, body: sse.Body, endpoint: str, started: float) -> AsyncIterator[bytes]:
        status = _CLIENT_CLOSED  # unless the stream runs to its end
        try:
            async for chunk in body:
                yield chunk
            status = body.status
        finally:
            self.in_flight -= 1
            self.metrics.finished(endpoint, status, time.perf_counter() - started)
