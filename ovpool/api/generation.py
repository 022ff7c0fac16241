"""The generation routes of the HTTP API: a dialect's body in, whole Completions or a stream out.

Composed with core.py's Api: its client, metrics and disconnect sweep, and ``serve``, the path every
route shares. ``dialects`` is the table of routes to dialects (dialect.py) the app serves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ovpool import errors
from ovpool.api import anthropic, openai_responses, responses, sse
from ovpool.api import errors as api_errors
from ovpool.api.body import read_json
from ovpool.api.dialect import Dialect
from ovpool.api.json_response import JsonResponse
from ovpool.api.schema import Generate, parse_chat, parse_completion
from ovpool.api.streams import ClientGone, Merged, fail_pending
from ovpool.completion import Completion

if TYPE_CHECKING:
    from ovpool.api.core import Api


def dialects(max_tokens: int) -> dict[str, Dialect]:
    """Each generation route's dialect, by route (/v1/<name>); ``max_tokens``: a chat's default."""
    chat = lambda body: parse_chat(body, max_tokens)  # noqa: E731
    output = lambda body: openai_responses.parse(body, max_tokens)  # noqa: E731
    openai = dict(full=responses.whole, writer=responses.ChunkWriter, errors=api_errors)
    return {
        "completions": Dialect("completions", parse_completion, **openai),
        "chat/completions": Dialect("chat", chat, **openai),
        "responses": Dialect("responses", output, openai_responses.full, openai_responses.ResponseWriter,
                             api_errors),
        "messages": Dialect("messages", anthropic.parse, anthropic.full, anthropic.MessageWriter, anthropic)}


class Generation:
    """The routes that generate, and Anthropic's count_tokens (a generation of none), on ``api``'s
    shared path; ``dialects``: by route (/v1/<name>)."""

    def __init__(self, api: Api, dialects: dict[str, Dialect]):
        self.api = api
        self.dialects = dialects

    def generate(self, name: str) -> Callable[[Request], Awaitable[Response]]:
        dialect = self.dialects[name]

        async def route(request: Request) -> Response:
            return await self.api.serve(request, dialect.endpoint, lambda r: self._generate(r, dialect),
                                     dialect.errors)
        return route

    async def count_tokens(self, request: Request) -> Response:
        return await self.api.serve(request, "count_tokens", self._count_tokens, anthropic)

    async def _generate(self, request: Request, dialect: Dialect) -> Response:
        gen = dialect.parse(await read_json(request))
        if gen.stream:
            return await self._stream(request, gen, dialect)
        completions = await self._complete(request, gen)
        self.api.metrics.counted(dialect.endpoint, responses.usage(gen, enumerate(completions)))
        return JsonResponse(dialect.full(gen, completions))

    async def _count_tokens(self, request: Request) -> Response:
        (completion,) = await self._complete(request, anthropic.parse_count(await read_json(request)))
        return JsonResponse({"input_tokens": completion.usage.prompt_tokens})

    async def _complete(self, request: Request, gen: Generate) -> list[Completion]:
        futures = [self.api.client.submit(c.prompt, model=gen.model, timeout=gen.timeout,
                                      keep_alive=gen.keep_alive, params=c.params) for c in gen.choices]
        with self.api.disconnects.watch(request, lambda: fail_pending(futures, ClientGone())):
            return await self._results(futures)

    async def _results(self, futures: list[asyncio.Future]) -> list[Completion]:
        """Every choice's Completion; one failing (or the caller going away) cancels the others."""
        try:
            return [await f for f in futures]
        except BaseException:
            for f in futures:  # a finished one's CANCEL is ignored by the broker
                await self.api.client.cancel(f)
            raise

    async def _stream(self, request: Request, gen: Generate, dialect: Dialect) -> Response:
        merged = Merged({c.index: self.api.client.stream(c.prompt, model=gen.model, timeout=gen.timeout,
                                                     keep_alive=gen.keep_alive, params=c.params)
                         for c in gen.choices})
        try:
            with self.api.disconnects.watch(request, merged.client_gone):
                first = await merged.__anext__()
        except BaseException:
            await merged.aclose()
            raise
        if isinstance(first[1], errors.OvpoolError):  # refused before any token: a real HTTP status
            await merged.aclose()
            raise first[1]
        body = sse.Body(dialect.writer(gen), first, merged, self.api.metrics, dialect.endpoint,
                        request.state.started)
        return StreamingResponse(body, media_type="text/event-stream", headers=sse.HEADERS)
