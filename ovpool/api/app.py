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

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ovpool.api import anthropic
from ovpool.api import errors as api_errors
from ovpool.api.core import Api, Config, http_response
from ovpool.api.dialect import ErrorShape
from ovpool.api.generation import Generation, dialects
from ovpool.api.json_response import JsonResponse
from ovpool.api.operations import Operations

__all__ = ["Config", "create_app"]


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
    if exc.status_code in (404, 405) and exc.detail in ("Not Found", "Method Not Allowed"):  # Starlette's
        exc = HTTPException(exc.status_code, _no_route(request.method, request.url.path, exc.status_code))
    return http_response(exc, _shape_of(request.url.path))


def _no_route(method: str, path: str, status: int) -> str:
    """What an unknown route or a wrong method gets told: what this API serves."""
    if status == 405:
        return f"{path} does not take {method}; docs/operations.md (The HTTP API) lists each route's method"
    return (f"this API has no route {path} (it serves /v1/chat/completions, /v1/completions, /v1/responses,"
            " /v1/messages and /v1/models; embeddings are not served); docs/operations.md (The HTTP API)")


def _shape_of(path: str) -> ErrorShape:
    """Anthropic's error JSON under its paths (an unknown /v1/messages/... too), else OpenAI's."""
    return anthropic if path.startswith("/v1/messages") else api_errors


