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
import dataclasses
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ovpool import errors, timing
from ovpool.api import anthropic, gateway_metrics, models, openai_responses, responses, sse
from ovpool.api import errors as api_errors
from ovpool.api.dialect import Dialect, ErrorShape
from ovpool.api.keys import ApiKeys
from ovpool.api.metrics import ApiMetrics
from ovpool.api.schema import MAX_BODY_BYTES, Generate, parse_chat, parse_completion, parse_json
from ovpool.api.streams import ClientGone, Disconnects, Merged, fail_pending
from ovpool.async_client import AsyncClient
from ovpool.completion import Completion

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
    api = _Api(config)
    generate = {f"/v1/{name}": api.generate(name) for name in api.dialects}
    routes = [Route("/v1/models", api.models, methods=["GET"]),
              Route("/v1/models/{model_id:path}", api.model, methods=["GET"]),
              *(Route(f"/v1/models/{{model_id:path}}/{action}", api.model_order(action), methods=["POST"])
                for action in ("load", "unload")),
              *(Route(path, route, methods=["POST"]) for path, route in generate.items()),
              Route("/v1/messages/count_tokens", api.count_tokens, methods=["POST"]),
              Route("/health", api.health, methods=["GET"]),
              Route("/health/ready", api.health, methods=["GET"]),
              Route("/admin/drain", api.admin_drain, methods=["POST"]),
              Route("/health/live", api.live, methods=["GET"]),
              Route("/metrics", api.metrics_page, methods=["GET"])]
    app = _App(routes=routes, lifespan=api.lifespan, exception_handlers={HTTPException: _http_error})
    app.state.api = api  # server.run drains through it
    app.direct = generate
    return app


class _App(Starlette):
    """Starlette, with a direct way to the generation routes: a POST to one of them skips the
    middleware stack and the route scan (~15% of the API's CPU per request). Their handler,
    _Api._serve, answers every error itself; anything else it raises is uvicorn's 500, as the
    middleware's would be. Every other request goes through Starlette."""

    direct: dict[str, Callable[[Request], Awaitable[Response]]] = {}

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        route = self.direct.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" \
            and not scope.get("root_path") else None
        if route is None:
            return await super().__call__(scope, receive, send)
        scope["app"] = self
        response = await route(Request(scope, receive, send))
        await response(scope, receive, send)


def _draining(reason: str, link: dict) -> JSONResponse:
    return JSONResponse({"status": "draining", "reason": reason, "link": link}, 503,
                        {"Retry-After": str(api_errors.RETRY_AFTER_S)})


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    return _http_response(exc, _shape_of(request.url.path))


def _shape_of(path: str) -> ErrorShape:
    """Anthropic's error JSON under its paths (an unknown /v1/messages/... too), else OpenAI's."""
    return anthropic if path.startswith("/v1/messages") else api_errors


def _http_response(exc: HTTPException, shape: ErrorShape) -> JSONResponse:
    return JSONResponse(shape.http_body(exc.status_code, exc.detail), exc.status_code)


def _error(exc: errors.OvpoolError, shape: ErrorShape) -> JSONResponse:
    return JSONResponse(shape.body(exc), api_errors.classify(exc)[0], api_errors.headers(exc))


class _Api:
    def __init__(self, config: Config):
        self.config = config
        self.metrics = ApiMetrics()
        self.client: AsyncClient | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.disconnects = Disconnects()
        self.draining = False  # server.run's drain: new requests get 503 + Retry-After
        self.in_flight = 0  # requests between their key check and their last byte
        chat = lambda body: parse_chat(body, config.max_tokens)  # noqa: E731
        output = lambda body: openai_responses.parse(body, config.max_tokens)  # noqa: E731
        openai = dict(full=responses.whole, writer=responses.ChunkWriter, errors=api_errors)
        self.dialects = {  # by route: /v1/<name>
            "completions": Dialect("completions", parse_completion, **openai),
            "chat/completions": Dialect("chat", chat, **openai),
            "responses": Dialect("responses", output, openai_responses.full, openai_responses.ResponseWriter,
                                 api_errors),
            "messages": Dialect("messages", anthropic.parse, anthropic.full, anthropic.MessageWriter,
                                anthropic)}

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

    # -- routes ---------------------------------------------------------------------------------

    async def models(self, request: Request) -> Response:
        return await self._serve(request, "models", self._models)

    async def model(self, request: Request) -> Response:
        return await self._serve(request, "models", self._model)

    def model_order(self, action: str) -> Callable[[Request], Awaitable[Response]]:
        async def route(request: Request) -> Response:
            return await self._serve(request, "admin", lambda r: self._order(r, action))

        return route

    def generate(self, name: str) -> Callable[[Request], Awaitable[Response]]:
        dialect = self.dialects[name]

        async def route(request: Request) -> Response:
            return await self._serve(request, dialect.endpoint, lambda r: self._generate(r, dialect),
                                     dialect.errors)
        return route

    async def count_tokens(self, request: Request) -> Response:
        return await self._serve(request, "count_tokens", self._count_tokens, anthropic)

    async def health(self, request: Request) -> Response:
        """Readiness: the broker answers a STATUS and lists a worker, and neither this API nor the
        pool drains (load balancers then stop sending at once)."""
        link = dataclasses.asdict(self.client.link_state())
        if self.draining:
            return _draining("this HTTP API is draining (it is stopping)", link)
        try:
            status = await self.client.status(self.config.status_timeout_s)
        except errors.OvpoolError as exc:
            return JSONResponse({"status": "unavailable", "reason": str(exc), "link": link}, 503)
        workers = status.get("workers")
        if not isinstance(workers, list) or not workers:  # a broker's STATUS reply is its word
            return JSONResponse({"status": "unavailable", "reason": "no worker is registered",
                                 "link": link}, 503)
        if (status.get("draining") or {}).get("pool"):
            return _draining("the pool is draining (shutting down or restarting)", link)
        return JSONResponse({"status": "ok", "workers": len(workers), "link": link})

    async def admin_drain(self, request: Request) -> Response:
        return await self._serve(request, "admin", self._drain)

    async def _drain(self, request: Request) -> Response:
        """``{"worker": NAME, "timeout_s": N}`` (both optional; no worker: the whole pool)."""
        body = await _admin_body(request)
        worker, timeout = body.get("worker", ""), body.get("timeout_s", self.config.shutdown_timeout_s)
        if not isinstance(worker, str):
            raise errors.InvalidRequestError("the body is {\"worker\": NAME, \"timeout_s\": SECONDS}, "
                                             "both optional (no worker: the whole pool)", param="worker")
        timeout_s = _seconds(timeout)
        drained = (await self.client.drain(worker, timeout_s, self.config.status_timeout_s))["draining"]
        if worker and not drained["workers"]:
            raise errors.InvalidRequestError(f"no worker named {worker!r} is registered", param="worker")
        return JSONResponse({"draining": drained})

    async def live(self, request: Request) -> Response:
        """Liveness: the broker client reads replies. A broker or worker outage leaves it live (a
        restart of this process would not help); a stopped client does not."""
        link = self.client.link_state()
        if not link.reading:
            return JSONResponse({"status": "unavailable", "reason": link.stopped or "the broker client"
                                 " stopped", "link": dataclasses.asdict(link)}, 503)
        return JSONResponse({"status": "ok", "link": dataclasses.asdict(link)})

    async def metrics_page(self, request: Request) -> Response:
        """This API's metrics, and the inference gateway's gauges of the pool (gateway_metrics)."""
        try:
            status = await self.client.status(min(1.0, self.config.status_timeout_s))
        except errors.OvpoolError:
            status = None
        return Response(self.metrics.render() + gateway_metrics.render(status),
                        media_type=self.metrics.content_type)

    # -- the shared path ------------------------------------------------------------------------

    async def _serve(self, request: Request, endpoint: str, handler: Callable[[Request], Awaitable[Response]],
                     shape: ErrorShape = api_errors) -> Response:
        """Key check, the handler, its errors in ``shape``'s JSON, and the request's metrics."""
        started = request.state.started = time.perf_counter()
        self.in_flight += 1
        try:
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

    async def _models(self, request: Request) -> Response:
        status = await self.client.status(self.config.status_timeout_s)
        return JSONResponse({"object": "list", "data": models.listed(status)})

    async def _model(self, request: Request) -> Response:
        status = await self.client.status(self.config.status_timeout_s)
        return JSONResponse(models.one(status, request.path_params["model_id"]))

    async def _order(self, request: Request, action: str) -> Response:
        """202 with the model's state now: serve loads (or unloads, once idle) it within a poll."""
        model_id = request.path_params["model_id"]
        await _admin_body(request)  # none, or a JSON object (its fields are not read)
        status = await self.client.model_order(model_id, action, self.config.status_timeout_s)
        return JSONResponse({**models.ordered(status, model_id, action), "action": action}, 202)

    async def _generate(self, request: Request, dialect: Dialect) -> Response:
        gen = dialect.parse(await _json(request))
        if gen.stream:
            return await self._stream(request, gen, dialect)
        completions = await self._complete(request, gen)
        self.metrics.counted(dialect.endpoint, responses.usage(gen, enumerate(completions)))
        return JSONResponse(dialect.full(gen, completions))

    async def _count_tokens(self, request: Request) -> Response:
        (completion,) = await self._complete(request, anthropic.parse_count(await _json(request)))
        return JSONResponse({"input_tokens": completion.usage.prompt_tokens})

    async def _complete(self, request: Request, gen: Generate) -> list[Completion]:
        futures = [self.client.submit(c.prompt, model=gen.model, timeout=gen.timeout,
                                      keep_alive=gen.keep_alive, **c.sampling) for c in gen.choices]
        with self.disconnects.watch(request, lambda: fail_pending(futures, ClientGone())):
            return await self._results(futures)

    async def _results(self, futures: list[asyncio.Future]) -> list[Completion]:
        """Every choice's Completion; one failing (or the caller going away) cancels the others."""
        try:
            return [await f for f in futures]
        except BaseException:
            for f in futures:  # a finished one's CANCEL is ignored by the broker
                await self.client.cancel(f)
            raise

    async def _stream(self, request: Request, gen: Generate, dialect: Dialect) -> Response:
        merged = Merged({c.index: self.client.stream(c.prompt, model=gen.model, timeout=gen.timeout,
                                                     keep_alive=gen.keep_alive, **c.sampling)
                         for c in gen.choices})
        try:
            with self.disconnects.watch(request, merged.client_gone):
                first = await merged.__anext__()
        except BaseException:
            await merged.aclose()
            raise
        if isinstance(first[1], errors.OvpoolError):  # refused before any token: a real HTTP status
            await merged.aclose()
            raise first[1]
        body = sse.Body(dialect.writer(gen), first, merged, self.metrics, dialect.endpoint,
                        request.state.started)
        return StreamingResponse(body, media_type="text/event-stream", headers=sse.HEADERS)


async def _admin_body(request: Request) -> dict:
    """An admin route's body: none (``{}``) or a JSON object, read like any request's (_json)."""
    body = await _json(request, empty=b"{}")
    if not isinstance(body, dict):
        raise errors.InvalidRequestError("the request body must be a JSON object (or none)")
    return body


def _seconds(value: Any) -> float:
    """``timeout_s``: a finite number of seconds >= 0 (NaN, -1 or 1e400 would drain the pool now)."""
    seconds = math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an int past float's range (10**400)
            pass
    if not math.isfinite(seconds) or seconds < 0:
        raise errors.InvalidRequestError(f"timeout_s must be a finite number of seconds >= 0, not "
                                         f"{json.dumps(value)[:40]}", param="timeout_s")
    return seconds


async def _json(request: Request, empty: bytes | None = None) -> Any:
    """The request's JSON body, read only up to MAX_BODY_BYTES (413 past it); ``empty``: the JSON
    text an empty body stands for (else it is malformed)."""
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large()
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise _too_large()
            chunks.append(chunk)
    except ClientDisconnect:  # gone before its body was all sent: no answer, no traceback
        raise ClientGone() from None
    return parse_json(b"".join(chunks) or empty or b"")


def _too_large() -> HTTPException:
    return HTTPException(413, f"the request body is over {MAX_BODY_BYTES:,} bytes "
                              f"({MAX_BODY_BYTES >> 20} MiB), the most a request may send")
