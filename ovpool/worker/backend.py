"""How a worker process drives generation: a Backend holds up to ``slots`` sessions and advances
all of them by one token per ``step()``.

``NullBackend`` fakes a model (tokens derived from the seed and prompt, optional per-step delay)
so the broker, worker and client can be tested and benchmarked without OpenVINO.
``EngineBackend`` runs an Engine's generations: one batched forward pass per step (continuous
batching, ovpool.worker.batcher), or interleaved, one pass per generation per step.
"""

from __future__ import annotations

import logging
import random
import time
import zlib
from typing import Any, Protocol

from ovpool.completion import Completion, Delta, Usage
from ovpool.errors import CacheError, InvalidRequestError, ModelLoadError, OvpoolError
from ovpool.worker.events import Event, Failed, Finished, Token
from ovpool.worker.sampling import SamplingParams

__all__ = ["Backend", "EngineBackend", "Event", "Failed", "Finished", "NullBackend", "Token"]
log = logging.getLogger("ovpool.worker")

PromptOrMessages = str | list[dict[str, Any]]


class Backend(Protocol):
    models: list[str]
    slots: int

    @property
    def active(self) -> int: ...

    def add(self, request_id: str, prompt: PromptOrMessages, params: SamplingParams) -> None: ...

    def cancel(self, request_id: str) -> None: ...

    def step(self) -> list[Event]: ...


def _check_room(active: int, slots: int) -> None:
    if active >= slots:
        raise InvalidRequestError(f"worker has no free slot ({slots} in use)")


class _NullSession:
    def __init__(self, prompt_tokens: int, params: SamplingParams, text: str):
        self.params = params
        self.prompt_tokens = prompt_tokens
        # crc32, unlike hash(), is the same in every process: same seed and prompt, same tokens.
        self.rng = random.Random((params.seed or 0) ^ zlib.crc32(text.encode()))
        self.token_ids: list[int] = []
        self.started = time.perf_counter()


class NullBackend:
    """Deterministic fake tokens: ``" t<id>"`` with ids drawn from (seed, prompt); no model at all."""

    def __init__(self, models: list[str] | None = None, slots: int = 8, token_delay_s: float = 0.0,
                 max_prompt_tokens: int = 8192, vocab_size: int = 1000):
        self.models = list(models or ["null"])
        self.slots = slots
        self.token_delay_s = token_delay_s
        self.max_prompt_tokens = max_prompt_tokens
        self.vocab_size = vocab_size
        self._sessions: dict[str, _NullSession] = {}

    @property
    def active(self) -> int:
        return len(self._sessions)

    def add(self, request_id: str, prompt: PromptOrMessages, params: SamplingParams) -> None:
        _check_room(self.active, self.slots)
        text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
        n = len(text.split())  # a word is a "token" here
        if n > self.max_prompt_tokens:
            raise InvalidRequestError(f"prompt has {n} tokens, more than max_prompt_tokens="
                                      f"{self.max_prompt_tokens}; shorten it or raise the setting")
        self._sessions[request_id] = _NullSession(n, params, text)

    def cancel(self, request_id: str) -> None:
        self._sessions.pop(request_id, None)

    def step(self) -> list[Event]:
        if self.token_delay_s:
            time.sleep(self.token_delay_s)  # one "forward pass" for all sessions together
        events: list[Event] = []
        for rid, s in list(self._sessions.items()):
            token_id = s.rng.randrange(self.vocab_size)
            s.token_ids.append(token_id)
            events.append(Token(rid, Delta(len(s.token_ids) - 1, token_id, f" t{token_id}")))
            if len(s.token_ids) >= s.params.max_tokens:
                del self._sessions[rid]
                events.append(Finished(rid, self._completion(s)))
        return events

    @staticmethod
    def _completion(s: _NullSession) -> Completion:
        total = time.perf_counter() - s.started
        return Completion(text="".join(f" t{t}" for t in s.token_ids), token_ids=list(s.token_ids),
                          finish_reason="length", usage=Usage(s.prompt_tokens, len(s.token_ids)),
                          timings={"total_s": total})


class EngineBackend:
    """Up to ``slots`` generations of one Engine.

    With ``batching=paged`` (the default) each ``step()`` is ONE forward pass over all of them
    (ovpool.worker.batcher: continuous batching); with ``interleaved``, or in cache-only mode when
    the paged graph is not in the cache, each generation runs its own pass on its own InferRequest.
    """

    def __init__(self, engine: Any, slots: int = 8, max_prompt_tokens: int = 8192,
                 aliases: list[str] | None = None):
        self.engine = engine
        self.models = list(dict.fromkeys([engine.name, *(aliases or [])]))
        self.slots = slots
        self.runs = _runs(engine, slots, max_prompt_tokens)

    @property
    def active(self) -> int:
        return self.runs.active

    def add(self, request_id: str, prompt: PromptOrMessages, params: SamplingParams) -> None:
        _check_room(self.active, self.slots)
        _translated(self.runs.add, request_id, prompt, params)

    def cancel(self, request_id: str) -> None:
        self.runs.cancel(request_id)

    def step(self) -> list[Event]:
        return self.runs.step()


def _runs(engine: Any, slots: int, max_prompt_tokens: int) -> Any:
    if engine.settings.batching == "paged":
        from ovpool.worker.batcher import Batcher  # OpenVINO: not for NullBackend users

        try:
            return Batcher.load(engine, slots, max_prompt_tokens)
        except CacheError as exc:
            if not engine.cache_only:
                raise
            log.warning("continuous batching is off: %s; running each sequence on its own", exc)
    return Interleaved(engine, max_prompt_tokens)


class Interleaved:
    """Engine generations side by side, each advanced by its own forward pass per ``step()``."""

    def __init__(self, engine: Any, max_prompt_tokens: int):
        self.engine = engine
        self.max_prompt_tokens = max_prompt_tokens
        self._generations: dict[str, Any] = {}

    @property
    def active(self) -> int:
        return len(self._generations)

    def add(self, request_id: str, prompt: PromptOrMessages, params: SamplingParams) -> None:
        gen = self.engine.generation(prompt, params, prefill_chunk=self.engine.settings.prefill_chunk)
        n = len(gen.prompt_ids)
        if n > self.max_prompt_tokens:
            gen.close()
            raise InvalidRequestError(f"prompt has {n} tokens, more than max_prompt_tokens="
                                      f"{self.max_prompt_tokens}; shorten it or raise the setting")
        self._generations[request_id] = gen

    def cancel(self, request_id: str) -> None:
        gen = self._generations.pop(request_id, None)
        if gen is not None:
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
                err = exc if isinstance(exc, OvpoolError) else ModelLoadError(f"generation failed: {exc}")
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
        raise ModelLoadError(f"cannot start a generation: {exc}") from exc
