"""The OpenAI- and Anthropic-compatible HTTP API as a Starlette app in front of the broker (one
AsyncClient).

Routes: ``GET /v1/models`` and ``/v1/models/{id}``, ``POST /v1/completions``,
``/v1/chat/completions``, ``/v1/responses`` (OpenAI's), ``/v1/messages`` and
``/v1/messages/count_tokens`` (Anthropic's), each streamed as server-sent events with ``stream:
true``; the last three are dialects over the chat core (dialect.py, docs/api.md). ``GET /health``
(ready: the link to the broker is up, a worker registered and nothing drains; also ``GET
/health/ready``), ``GET /health/live`` (this process is of use: its broker client still reads
replies), ``GET /metrics``, ``POST /admin/drain`` (drain the pool or a worker, protocol.Drain; it
needs an API key like ``/v1/*``), ``POST /v1/models/{id}/load`` and ``/unload`` (a model `ovpool
serve` loads on demand, protocol.ModelOrder). A draining API (server.run on SIGTERM) answers 503 with
Retry-After to new requests and lets those in flight finish within shutdown_timeout_s.
``/v1/*`` needs an API key (Bearer or x-api-key) when keys are configured; health and metrics
stay open for probes and scrapers. Should the broker client's I/O loop ever stop, the app records why in
``app.state.link_lost`` and server.run exits, so the process's supervisor starts a fresh one
instead of keeping a process that answers every request with 503.

A request is admitted (or refused with its HTTP status) before any byte of a stream is sent: the
first token, or the error that came instead of it, decides the status. A client that disconnects
cancels its requests, whether it was waiting for a whole completion or reading a stream.
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
from starlette.routing import Route

from ovpool import errors, timing
from ovpool.api import anthropic, sse
from ovpool.api import errors as api_errors
from ovpool.api.dialect import ErrorShape
from ovpool.api.generation import Generation, dialects
from ovpool.api.json_response import JsonResponse
from ovpool.api.keys import ApiKeys
from ovpool.api.metrics import ApiMetrics
from ovpool.api.operations import Operations
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


def create_app(config: Config) -> Starlette:
    api = Api(config)
    gen, ops = Generation(api, dialects(config.max_tokens)), Operations(api)
    generate = {f"/v1/{name}": gen.generate(name) for name in gen.dialects}
    routes = [Route("/v1/models", ops.models, methods=["GET"]),
              Route("/v1/models/{model_id:path}", ops.model, methods=["GET"]),
              *(Route(f"/v1/models/{{model_id:path}}/{action}", ops.model_order(action), methods=["POST"])
                for action in ("load", "unload")),
              *(Route(path, route, methods=["POST"]) for path, route in generate.items()),
              Route("/v1/messages/count_tokens", gen.count_tokens, methods=["POST"]),
              Route("/health", ops.health, methods=["GET"]),
              Route("/health/ready", ops.health, methods=["GET"]),
              Route("/admin/drain", ops.admin_drain, methods=["POST"]),
              Route("/health/live", ops.live, methods=["GET"]),
              Route("/metrics", ops.metrics_page, methods=["GET"])]
    app = _App(generate, routes=routes, lifespan=api.lifespan,
               exception_handlers={HTTPException: _http_error})
    app.state.api = api  # server.run drains through it
    return app


class _App(Starlette):
    """Starlette, with a direct way to the generation routes: a POST to one of them skips the
    middleware stack and the route scan (their cost: docs/performance.md, HTTP API overhead). Their handler,
    Api.serve, answers every error itself; anything else it raises is uvicorn's 500, as the
    middleware's would be. Every other request goes through Starlette. ``direct``: those routes,
    by path; each app its own."""

    def __init__(self, direct: dict[str, Callable[[Request], Awaitable[Response]]], **starlette: Any):
        super().__init__(**starlette)
        self.direct = direct

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        route = self.direct.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" \
            and not scope.get("root_path") else None
        if route is None:
            return await super().__call__(scope, receive, send)
        scope["app"] = self
        response = await route(Request(scope, receive, send))
        await response(scope, receive, send)


async def _http_error(request: Request, exc: HTTPException) -> JsonResponse:
    return _http_response(exc, _shape_of(request.url.path))


def _shape_of(path: str) -> ErrorShape:
    """Anthropic's error JSON under its paths (an unknown /v1/messages/... too), else OpenAI's."""
    return anthropic if path.startswith("/v1/messages") else api_errors


def _http_response(exc: HTTPException, shape: ErrorShape) -> JsonResponse:
    return JsonResponse(shape.http_body(exc.status_code, exc.detail), exc.status_code)


def _error(exc: errors.OvpoolError, shape: ErrorShape) -> JsonResponse:
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
            response = _error(exc, shape)
        except HTTPException as exc:  # a body over MAX_BODY_BYTES
            response = _http_response(exc, shape)
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
