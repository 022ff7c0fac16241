"""How a worker process drives generation: a Backend holds up to ``slots`` sessions and advances
all of them by one token per ``step()``.

``NullBackend`` (ovpool.worker.null_backend) fakes a model, for tests and benchmarks.
``EngineBackend`` runs an Engine's generations: one batched forward pass per step (continuous
batching, ovpool.worker.generate.batcher), or interleaved, one pass per generation per step.

What a worker reports of its prefix cache (docs/prefix-caching.md): each request comes with opaque
``route_keys`` (the broker's, over the request's text); ``held_route_keys(limit)`` lists those of
requests whose KV is still cached, most recently used first; ``prompt_tokens`` and
``cached_prompt_tokens`` count the prompt tokens admitted and, of those, the ones not recomputed.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ovpool.errors import InferenceError, InvalidRequestError, OvpoolError
from ovpool.sampling_params import SamplingParams
from ovpool.worker.events import Event, Failed, Finished, Token

if TYPE_CHECKING:  # OpenVINO underneath: not imported by NullBackend users
    from ovpool.worker.engine import Engine
    from ovpool.worker.generate.batcher import Batcher
    from ovpool.worker.generate.generation import Generation
    from ovpool.worker.generate.streams import Stream

__all__ = ["Backend", "EngineBackend", "Event", "Failed", "Finished", "Runtime", "Token"]
log = logging.getLogger("ovpool.worker")

PromptOrMessages = str | list[dict[str, Any]]


class Runtime(Protocol):
    """What runs requests: ``add`` one (or raise an OvpoolError that refuses it), ``cancel`` one,
    and ``step`` all of them on, reporting each one's tokens, completion or failure. The Batcher
    (ovpool.worker.generate.batcher) and ``Interleaved`` are the two; a Backend is one too."""

    @property
    def active(self) -> int: ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def cached_prompt_tokens(self) -> int: ...

    def add(self, request_id: str, prompt: PromptOrMessages, params: SamplingParams,
            route_keys: Sequence[bytes] = ()) -> None: ...

    def cancel(self, request_id: str) -> None: ...

    def step(self) -> list[Event]: ...


class Backend(Runtime, Protocol):
    """A worker's Runtime, with what the worker tells the broker of it."""

    models: list[str]
    slots: int

    def held_route_keys(self, limit: int) -> list[bytes]: ...

    def record_kv_events(self) -> None:
        """Record prefix-cache block events for ``kv_events`` from now on (the worker publishes
        them: kv_events_endpoint); none are recorded before."""

    def kv_events(self) -> tuple[int, list]:
        """(block size, prefix-cache block events since the last call: ovpool.worker.kv_events)."""

    def idle(self) -> bool | None:
        """Nothing is running or waiting: a moment for one-time work (e.g. kernel set-up). True: it
        has more to do later in this idle period (the worker calls it again at its next poll);
        False: it runs once per idle period; None: the backend has no idle work at all (the worker
        stops calling it)."""


def check_room(active: int, slots: int) -> None:
    """Refuses a request past a backend's ``slots``."""
    if active >= slots:
        raise InvalidRequestError(f"worker has no free slot ({slots} in use)")


class EngineBackend:
    """Up to ``slots`` generations of one Engine.

    With ``batching=paged`` (the default) each ``step()`` is ONE forward pass over all of them
    (ovpool.worker.generate.batcher: continuous batching), on the engine's own graph where it is
    the paged one. Where it is not (the compatibility seam, ``Engine._stateful_seam``), the paged
    graph loads in a background thread (it is compiled from the cache's IR, see ovpool.cache.ir),
    so the worker serves from its first second: until it is ready, and when it cannot load
    (cache-only mode without that IR), each generation runs its own pass on its own InferRequest;
    requests started that way finish that way. That load begins after the first step or at the
    first idle moment, whichever comes first: begun at once, its compile took the cores from the
    first requests of a model loaded on demand (their first token ~0.4 s later on 2 cores,
    docs/performance.md, Model swaps). ``batching=interleaved`` runs each request as an
    engine generation. ``engine.load_report["batching"]`` says which, in words.
    """

    def __init__(self, engine: Engine, slots: int = 8, aliases: list[str] | None = None,
                 names: list[str] | None = None):
        self.engine = engine
        # ``names`` (--served-name) replace the model's own name and aliases, as vLLM's do.
        self.models = list(dict.fromkeys(names or [engine.name, *(aliases or [])]))
        self.slots = slots
        self._interleaved = Interleaved(engine)
        self._batcher: Batcher | None = None
        self._record_kv_events = False  # the worker publishes them: the batcher records them
        engine.load_report["batching"] = engine.batching_plan()  # what READY tells `ovpool status`
        self._loading: concurrent.futures.Future | None = None
        self._load_due = engine.config.batching == "paged"
        if engine.attention == "paged":  # the engine's own graph: batching from the start
            self._begin_batching()

    def _begin_batching(self) -> None:
        """Begin loading the paged graph for the Batcher, once."""
        if self._load_due:
            self._load_due = False
            self._loading = _load_batcher(self.engine, self.slots)

    @property
    def runs(self) -> Runtime:
        """Where new requests go: the Batcher once it has loaded (see ``_take_batcher``), else
        ``Interleaved``."""
        return self._batcher or self._interleaved

    def _take_batcher(self) -> None:
        """Take the Batcher over once the paged graph has loaded (or say why there is none)."""
        if self._loading is not None and self._loading.done():
            loading, self._loading = self._loading, None
            try:
                self._batcher = loading.result()
                if self._record_kv_events:
                    self._batcher.record_kv_events()
            except Exception as exc:  # the worker keeps serving without batching; say why, once
                self.engine.load_report["batching"] = f"off: {exc}"
                log.warning("continuous batching is off: %s; each request runs on its own", exc)
        if self._batcher is not None and not self._interleaved.active:
            # Every new request goes to the batcher: the graph the engine started on is unused.
            self.engine.serve_on_paged()

    def wait_batching(self, timeout: float | None = None) -> bool:
        """Wait for the paged graph; whether new requests are now batched."""
        self._begin_batching()
        if self._loading is not None:
            concurrent.futures.wait([self._loading], timeout)
        self._take_batcher()
        return self._batcher is not None

    @property
    def active(self) -> int:
        return self._interleaved.active + (self._batcher.active if self._batcher else 0)

    @property
    def prompt_tokens(self) -> int:
        return sum(runs.prompt_tokens for runs in self._runners())

    @property
    def cached_prompt_tokens(self) -> int:
        return sum(runs.cached_prompt_tokens for runs in self._runners())

    def held_route_keys(self, limit: int) -> list[bytes]:
        """The batcher's (the single-stream sessions keep no route keys)."""
        return self._batcher.held_route_keys(limit) if self._batcher is not None else []

    def record_kv_events(self) -> None:
        self._record_kv_events = True
        if self._batcher is not None:
            self._batcher.record_kv_events()

    def kv_events(self) -> tuple[int, list]:
        """(block size, the batcher's prefix-cache block events since the last call); the
        single-stream sessions cache no blocks."""
        if self._batcher is None:
            return 0, []
        return self._batcher.runner.block_size, self._batcher.kv_events()

    def _runners(self) -> list[Runtime]:
        return [self._interleaved] + ([self._batcher] if self._batcher is not None else [])

    def add(self, request_id: str, prompt: PromptOrMessages, params: SamplingParams,
            route_keys: Sequence[bytes] = ()) -> None:
        check_room(self.active, self.slots)
        self._take_batcher()
        _translated(self.runs.add, request_id, prompt, params, tuple(route_keys))

    def cancel(self, request_id: str) -> None:
        for runs in self._runners():
            runs.cancel(request_id)

    def step(self) -> list[Event]:
        events = self._interleaved.step() if self._interleaved.active else []
        self._begin_batching()  # after the first requests' first pass, not beside it
        self._take_batcher()
        if self._batcher is not None:
            events += self._batcher.step()
        return events

    def idle(self) -> bool:
        """True while the paged graph still loads: it is taken, and set up, once it has."""
        self._begin_batching()
        if self.engine.config.warm_up != "idle":
            return False
        self._take_batcher()  # first: a graph the batcher replaces is not worth setting up
        if not self.engine.warmed:
            self.engine.warm_up()
            log.info("kernels set up while idle in %.2f s", self.engine.load_report["seconds"]["warm-up"])
        self._take_batcher()
        if self._batcher is not None:
            self._batcher.warm_up()
        return self._loading is not None


def _load_batcher(engine: Engine, slots: int) -> concurrent.futures.Future | None:
    """The Batcher: at once on the engine's own paged graph, else on a thread of its own while
    the engine loads the paged graph."""
    if engine.config.batching != "paged":
        return None
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="paged-graph")
    future = pool.submit(lambda: engine.batcher(max_running=slots))
    pool.shutdown(wait=engine.attention == "paged")  # the engine's own graph: ready at once
    return future


class Interleaved:
    """Engine generations side by side, each advanced by ``step()``: the worker's side of the
    compatibility seam (``Engine._stateful_seam``: one pass per generation per step), and the
    runtime of ``batching=interleaved``."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._generations: dict[str, Generation | Stream] = {}
        self.prompt_tokens = self.cached_prompt_tokens = 0

    @property
    def active(self) -> int:
        return len(self._generations)

    def add(self, request_id: str, prompt: PromptOrMessages, params: SamplingParams,
            route_keys: Sequence[bytes] = ()) -> None:
        """``route_keys`` are not kept: a session's KV is reused by prompt, not by key."""
        gen = self.engine.generation(prompt, params, prefill_chunk=self.engine.config.prefill_chunk)
        self._generations[request_id] = gen
        self.prompt_tokens += len(gen.prompt_ids)

    def cancel(self, request_id: str) -> None:
        gen = self._generations.pop(request_id, None)
        if gen is not None:
            self.cached_prompt_tokens += gen.cached  # known once it ran
            gen.close()

    def step(self) -> list[Event]:
        events: list[Event] = []
        for rid, gen in list(self._generations.items()):
            try:
                delta = gen.step()
                if delta is not None:
                    events.append(Token(rid, delta))
                if gen.finished:
                    events.append(Finished(rid, gen.completion()))
            except Exception as exc:  # one failing sequence must not take the others down
                err = exc if isinstance(exc, OvpoolError) else InferenceError(f"generation failed: {exc}")
                events.append(Failed(rid, err))
            else:
                if not gen.finished:
                    continue
            self.cancel(rid)
        return events


def _translated(func: Any, *args: Any) -> Any:
    try:
        return func(*args)
    except OvpoolError:
        raise
    except Exception as exc:  # the engine is OpenVINO underneath: report it as ours
        raise InferenceError(f"cannot start a generation: {exc}") from exc
