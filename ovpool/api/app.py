"""The OpenAI-compatible HTTP API as a Starlette app in front of the broker (one AsyncClient).

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (streamed as
server-sent events with ``stream: true``), ``GET /health`` (ready: the link to the broker is up and
a worker registered), ``GET /health/live`` (this process is of use: its broker client still reads
replies), ``GET /metrics``. ``/v1/*`` needs a Bearer key when keys are configured; health and
metrics stay open for probes and scrapers. Should the broker client's I/O loop ever stop, the app
records why in ``app.state.link_lost`` and server.run exits, so the process's supervisor starts a
fresh one instead of keeping a process that answers every request with 503.

A request is admitted (or refused with its HTTP status) before any byte of a stream is sent: the
first token, or the error that came instead of it, decides the status. A client that disconnects
cancels its requests, whether it was waiting for a whole completion or reading a stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
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
from ovpool.api import errors as api_errors
from ovpool.api import responses, sse
from ovpool.api.keys import ApiKeys
from ovpool.api.metrics import ApiMetrics
from ovpool.api.schema import MAX_BODY_BYTES, Generate, parse_chat, parse_completion, parse_json
from ovpool.api.streams import ClientGone, Disconnects, Merged, fail_pending
from ovpool.async_client import AsyncClient
from ovpool.completion import Completion, Delta

log = logging.getLogger(__name__)

_CLIENT_CLOSED = 499  # nginx's status for "the client closed the connection first", in metrics only


@dataclass
class Config:
    broker: str
    settings: Any
    keys: ApiKeys
    max_tokens: int  # a chat request's default max_tokens (the pool's max_new_tokens)
    status_timeout_s: float = 5.0


def create_app(config: Config) -> Starlette:
    api = _Api(config)
    routes = [Route("/v1/models", api.models, methods=["GET"]),
              Route("/v1/completions", api.completions, methods=["POST"]),
              Route("/v1/chat/completions", api.chat, methods=["POST"]),
              Route("/health", api.health, methods=["GET"]),
              Route("/health/live", api.live, methods=["GET"]),
              Route("/metrics", api.metrics_page, methods=["GET"])]
    return Starlette(routes=routes, lifespan=api.lifespan,
                     exception_handlers={HTTPException: _http_error})


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    return _http_response(exc)


def _http_response(exc: HTTPException) -> JSONResponse:
    return JSONResponse(api_errors.http_body(exc.status_code, exc.detail), exc.status_code)


def _error(exc: errors.OvpoolError) -> JSONResponse:
    return JSONResponse(api_errors.body(exc), api_errors.classify(exc)[0], api_errors.headers(exc))


class _Api:
    def __init__(self, config: Config):
        self.config = config
        self.metrics = ApiMetrics()
        self.client: AsyncClient | None = None
        self.disconnects = Disconnects()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        async with AsyncClient(self.config.broker, settings=self.config.settings) as client:
            self.client = client
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

    async def completions(self, request: Request) -> Response:
        return await self._serve(request, "completions", lambda r: self._generate(r, parse_completion))

    async def chat(self, request: Request) -> Response:
        parse = lambda body: parse_chat(body, self.config.max_tokens)  # noqa: E731
        return await self._serve(request, "chat", lambda r: self._generate(r, parse))

    async def health(self, request: Request) -> Response:
        """Readiness: the broker answers a STATUS and lists a worker."""
        link = dataclasses.asdict(self.client.link_state())
        try:
            workers = (await self.client.status(self.config.status_timeout_s)).get("workers")
        except errors.OvpoolError as exc:
            return JSONResponse({"status": "unavailable", "reason": str(exc), "link": link}, 503)
        if not isinstance(workers, list) or not workers:  # a broker's STATUS reply is its word
            return JSONResponse({"status": "unavailable", "reason": "no worker is registered",
                                 "link": link}, 503)
        return JSONResponse({"status": "ok", "workers": len(workers), "link": link})

    async def live(self, request: Request) -> Response:
        """Liveness: the broker client reads replies. A broker or worker outage leaves it live (a
        restart of this process would not help); a stopped client does not."""
        link = self.client.link_state()
        if not link.reading:
            return JSONResponse({"status": "unavailable", "reason": link.stopped or "the broker client"
                                 " stopped", "link": dataclasses.asdict(link)}, 503)
        return JSONResponse({"status": "ok", "link": dataclasses.asdict(link)})

    async def metrics_page(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    # -- the shared path ------------------------------------------------------------------------

    async def _serve(self, request: Request, endpoint: str,
                     handler: Callable[[Request], Awaitable[Response]]) -> Response:
        """Key check, the handler, its errors as OpenAI JSON, and the request's metrics."""
        started = request.state.started = time.perf_counter()
        try:
            self.config.keys.check(request.headers.get("authorization"))
            response = await handler(request)
        except errors.OvpoolError as exc:
            response = _error(exc)
        except HTTPException as exc:  # a body over MAX_BODY_BYTES
            response = _http_response(exc)
        except ClientGone:
            self.metrics.finished(endpoint, _CLIENT_CLOSED, time.perf_counter() - started)
            return Response(status_code=_CLIENT_CLOSED)
        if isinstance(response, StreamingResponse):
            response.body_iterator = self._timed(response.body_iterator, endpoint, started)
        else:
            self.metrics.finished(endpoint, response.status_code, time.perf_counter() - started)
        return response

    async def _timed(self, body: _SSE, endpoint: str, started: float) -> AsyncIterator[bytes]:
        status = _CLIENT_CLOSED  # unless the stream runs to its end
        try:
            async for chunk in body:
                yield chunk
            status = body.status
        finally:
            self.metrics.finished(endpoint, status, time.perf_counter() - started)

    async def _models(self, request: Request) -> Response:
        status = await self.client.status(self.config.status_timeout_s)
        counts: dict[str, int] = {}
        for worker in status["workers"]:
            for name in worker["models"]:
                counts[name] = counts.get(name, 0) + 1
        created = int(time.time() - status["uptime_s"])
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "ovpool", "workers": n}
            for name, n in sorted(counts.items())]})

    async def _generate(self, request: Request, parse: Callable[[Any], Generate]) -> Response:
        gen = parse(await _json(request))
        reply = responses.Reply(gen)
        if gen.stream:
            return await self._stream(request, reply)
        futures = [self.client.submit(c.prompt, model=gen.model, timeout=gen.timeout, **c.sampling)
                   for c in gen.choices]
        with self.disconnects.watch(request, lambda: fail_pending(futures, ClientGone())):
            completions = await self._results(futures)
        body = responses.full(reply, completions)
        self.metrics.counted(_endpoint(gen), body["usage"])
        return JSONResponse(body)

    async def _results(self, futures: list[asyncio.Future]) -> list[Completion]:
        """Every choice's Completion; one failing (or the caller going away) cancels the others."""
        try:
            return [await f for f in futures]
        except BaseException:
            for f in futures:  # a finished one's CANCEL is ignored by the broker
                await self.client.cancel(f)
            raise

    async def _stream(self, request: Request, reply: responses.Reply) -> Response:
        gen = reply.gen
        merged = Merged({c.index: self.client.stream(c.prompt, model=gen.model, timeout=gen.timeout,
                                                     **c.sampling) for c in gen.choices})
        try:
            with self.disconnects.watch(request, merged.client_gone):
                first = await merged.__anext__()
        except BaseException:
            await merged.aclose()
            raise
        if isinstance(first[1], errors.OvpoolError):  # refused before any token: a real HTTP status
            await merged.aclose()
            raise first[1]
        body = _SSE(reply, first, merged, self.metrics, request.state.started)
        return StreamingResponse(body, media_type="text/event-stream", headers=sse.HEADERS)


class _SSE:
    """A streamed response's bytes: a chunk per token, each choice's last chunk, the usage chunk
    if asked for, ``data: [DONE]``; a failure becomes an error event before [DONE]."""

    def __init__(self, reply: responses.Reply, first: tuple[int, Any], events: Merged, metrics: ApiMetrics,
                 started: float):
        self.reply, self._first, self._events, self._metrics = reply, first, events, metrics
        self.status = 200
        self._endpoint = _endpoint(reply.gen)
        self._started = started
        self._last: dict[int, float] = {}  # choice index -> when its previous token came

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        try:
            yield self._event(*self._first)
            async for index, item in self._events:
                yield self._event(index, item)
            if self.reply.gen.include_usage:
                yield sse.data(responses.usage_chunk(self.reply))
        except errors.OvpoolError as exc:
            self.status = api_errors.classify(exc)[0]
            yield sse.error(exc)
        finally:
            await self._events.aclose()
        self._metrics.counted(self._endpoint, responses.usage(self.reply.gen, self.reply.finished.items()))
        yield sse.DONE

    def _event(self, index: int, item: Delta | Completion | errors.OvpoolError) -> bytes:
        if isinstance(item, Delta):
            now = time.perf_counter()
            previous = self._last.get(index)
            if previous is None:
                self._metrics.first_token(self._endpoint, now - self._started)
            else:
                self._metrics.next_token(self._endpoint, now - previous)
            self._last[index] = now
            return sse.data(responses.chunk(self.reply, index, item.text, item.logprobs))
        if isinstance(item, Completion):
            return sse.data(responses.last_chunk(self.reply, index, item))
        raise item


def _endpoint(gen: Generate) -> str:
    return "chat" if gen.chat else "completions"


async def _json(request: Request) -> Any:
    """The request's JSON body, read only up to MAX_BODY_BYTES (413 past it)."""
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
    return parse_json(b"".join(chunks))


def _too_large() -> HTTPException:
    return HTTPException(413, f"the request body is over {MAX_BODY_BYTES:,} bytes "
                              f"({MAX_BODY_BYTES >> 20} MiB), the most a request may send")
