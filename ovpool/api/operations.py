"""The HTTP API's routes besides generation: health and liveness probes, metrics, the model list
and its load and unload orders, and the admin drain.

Composed with core.py's Api: its client, config and metrics, and ``serve``, the path every route shares.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from ovpool import errors
from ovpool.api import errors as api_errors
from ovpool.api import gateway_metrics, models
from ovpool.api.body import admin_body
from ovpool.api.json_response import JsonResponse

if TYPE_CHECKING:
    from ovpool.api.core import Api


class Operations:
    """What operators and their tools call (probes, scrapers, admins), on ``api``'s shared path."""

    def __init__(self, api: Api):
        self.api = api

    async def models(self, request: Request) -> Response:
        return await self.api.serve(request, "models", self._models)

    async def model(self, request: Request) -> Response:
        return await self.api.serve(request, "models", self._model)

    def model_order(self, action: str) -> Callable[[Request], Awaitable[Response]]:
        async def route(request: Request) -> Response:
            return await self.api.serve(request, "admin", lambda r: self._order(r, action))

        return route

    async def health(self, request: Request) -> Response:
        """Readiness: the broker answers a STATUS and lists a worker, and neither this API nor the
        pool drains (load balancers then stop sending at once)."""
        link = dataclasses.asdict(self.api.client.link_state())
        if self.api.draining:
            return _draining_response("this HTTP API is draining (it is stopping)", link)
        try:
            status = await self.api.client.status(self.api.config.status_timeout_s)
        except errors.OvpoolError as exc:
            return JsonResponse({"status": "unavailable", "reason": str(exc), "link": link}, 503)
        workers = status.get("workers")
        if not isinstance(workers, list) or not workers:  # a broker's STATUS reply is its word
            return JsonResponse({"status": "unavailable", "reason": "no worker is registered",
                                 "link": link}, 503)
        if (status.get("draining") or {}).get("pool"):
            return _draining_response("the pool is draining (shutting down or restarting)", link)
        return JsonResponse({"status": "ok", "workers": len(workers), "link": link})

    async def admin_drain(self, request: Request) -> Response:
        return await self.api.serve(request, "admin", self._drain)

    async def _drain(self, request: Request) -> Response:
        """``{"worker": NAME, "timeout_s": N}`` (both optional; no worker: the whole pool)."""
        body = await admin_body(request)
        worker, timeout = body.get("worker", ""), body.get("timeout_s", self.api.config.shutdown_timeout_s)
        if not isinstance(worker, str):
            raise errors.InvalidRequestError("the body is {\"worker\": NAME, \"timeout_s\": SECONDS}, "
                                             "both optional (no worker: the whole pool)", param="worker")
        timeout_s = _seconds(timeout)
        status = await self.api.client.drain(worker, timeout_s, self.api.config.status_timeout_s)
        drained = status["draining"]
        if worker and not drained["workers"]:
            raise errors.InvalidRequestError(f"no worker named {worker!r} is registered", param="worker")
        return JsonResponse({"draining": drained})

    async def live(self, request: Request) -> Response:
        """Liveness: the broker client reads replies. A broker or worker outage leaves it live (a
        restart of this process would not help); a stopped client does not."""
        link = self.api.client.link_state()
        if not link.reading:
            return JsonResponse({"status": "unavailable", "reason": link.stopped or "the broker client"
                                 " stopped", "link": dataclasses.asdict(link)}, 503)
        return JsonResponse({"status": "ok", "link": dataclasses.asdict(link)})

    async def metrics_page(self, request: Request) -> Response:
        """This API's metrics, and the inference gateway's gauges of the pool (gateway_metrics)."""
        try:
            status = await self.api.client.status(min(1.0, self.api.config.status_timeout_s))
        except errors.OvpoolError:
            status = None
        return Response(self.api.metrics.render() + gateway_metrics.render(status),
                        media_type=self.api.metrics.content_type)

    async def _models(self, request: Request) -> Response:
        status = await self.api.client.status(self.api.config.status_timeout_s)
        return JsonResponse({"object": "list", "data": models.listed(status)})

    async def _model(self, request: Request) -> Response:
        status = await self.api.client.status(self.api.config.status_timeout_s)
        return JsonResponse(models.one(status, request.path_params["model_id"]))

    async def _order(self, request: Request, action: str) -> Response:
        """202 with the model's state now: serve loads (or unloads, once idle) it within a poll."""
        model_id = request.path_params["model_id"]
        await admin_body(request)  # none, or a JSON object (its fields are not read)
        status = await self.api.client.model_order(model_id, action, self.api.config.status_timeout_s)
        return JsonResponse({**models.ordered(status, model_id, action), "action": action}, 202)


def _draining_response(reason: str, link: dict) -> JsonResponse:
    return JsonResponse({"status": "draining", "reason": reason, "link": link}, 503,
                        {"Retry-After": str(api_errors.RETRY_AFTER_S)})


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
