"""Continuous batching for one Engine: every ``step()`` is ONE forward pass over all running requests.

The Scheduler (pure logic) says which tokens of which requests go into the pass; the PagedRunner
(OpenVINO) runs it; each request's Generation (sampling, stop strings, streaming text, EOS, limits:
the same code as a single-stream generation) takes the logits row of its last token. Requests
join between steps and long prompts are prefilled in ``prefill_chunk`` pieces next to running
decodes. A request whose sequence outgrows the whole KV cache fails with a clear error.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ovpool.errors import InferenceError, InvalidRequestError, OvpoolError
from ovpool.sampling_params import SamplingParams
from ovpool.worker.events import Event, Failed, Finished, Token
from ovpool.worker.generate.batch import PagedRunner, PagedSession
from ovpool.worker.generate.generation import Generation, check_prompt
from ovpool.worker.generate.penalties import check_vocab
from ovpool.worker.generate.scheduler import Scheduler
from ovpool.worker.generate.session import warm_up
from ovpool.worker.graph.loading import load_paged

log = logging.getLogger("ovpool.worker")


class Batcher:
    def __init__(self, engine: Any, runner: PagedRunner, *, max_running: int, prefill_chunk: int,
                 max_prompt_tokens: int):
        self.engine, self.runner = engine, runner
        self.max_prompt_tokens = max_prompt_tokens
        self.scheduler = Scheduler(num_blocks=runner.num_blocks, block_size=runner.block_size,
                                   prefill_chunk=prefill_chunk, max_running=max_running)
        self._generations: dict[str, Generation] = {}
        self.warmed = False

    def warm_up(self) -> None:
        """The device's one-time set-up for this graph (see session.warm_up): the engine's when it is
        the engine's graph (see load), else on a session of its own, so that no KV block of the
        scheduler's is touched."""
        if self.warmed:
            return
        if self.engine.attention == "paged":
            self.engine.warm_up()
        else:
            warm_up(PagedSession(self.runner.compiled, self.runner.decode))
        self.warmed = True

    @classmethod
    def load(cls, engine: Any, max_running: int, max_prompt_tokens: int | None = None) -> Batcher:
        """The paged graph of ``engine`` (its own if it runs one, else loaded through the cache)
        with its KV blocks."""
        s = engine.settings
        if engine.attention == "paged":  # the engine's single-stream graph: nothing to compile
            result = dataclasses.replace(engine.load_result, outcome="shared", seconds=0.0)
        else:
            result = load_paged(engine.model, s, engine.device, engine.core,
                                cache_dir=engine.cache_dir, cache_only=engine.cache_only)
            engine.model.close()  # as the Engine does: the compiled graph holds its own weights
        runner = PagedRunner(result.compiled, s.kv_cache_mb, decode=result.decode)
        engine.load_report["paged"] = {"outcome": result.outcome, "entry": result.entry,
                                       "seconds": result.seconds, "kv_blocks": runner.num_blocks,
                                       "block_size": runner.block_size}
        log.info("continuous batching: %d KV blocks of %d positions (%.0f MiB), graph %s in %.1f s",
                 runner.num_blocks, runner.block_size, runner.kv_bytes / 2**20, result.outcome,
                 result.seconds)
        return cls(engine, runner, max_running=max_running, prefill_chunk=s.prefill_chunk,
                   max_prompt_tokens=max_prompt_tokens or s.max_prompt_tokens)

    @property
    def active(self) -> int:
        return len(self._generations)

    def add(self, request_id: str, prompt: Any, params: SamplingParams) -> None:
        ids = self._prompt_ids(prompt, params)
        if not self.scheduler.fits(len(ids) + 1):
            raise InvalidRequestError(
                f"the prompt has {len(ids)} tokens but the KV cache holds "
                f"{self.scheduler.num_blocks * self.scheduler.block_size} positions; raise kv_cache_mb")
        h = self.engine.hparams
        self._generations[request_id] = Generation(None, None, ids, params, self.engine.tokenizer,
                                                   context_length=h.context_length)
        self.scheduler.add(request_id, ids)

    def _prompt_ids(self, prompt: Any, params: SamplingParams) -> list[int]:
        limit = self.engine.settings.max_new_tokens
        if params.max_tokens > limit:
            raise InvalidRequestError(f"max_tokens = {params.max_tokens} exceeds max_new_tokens = {limit}; "
                                      "lower it or raise that setting")
        ids = self.engine.prompt_ids(prompt)
        h = self.engine.hparams
        check_prompt(ids, vocab_size=h.vocab_size, context_length=h.context_length,
                     max_prompt_tokens=self.max_prompt_tokens, new_tokens=1)
        check_vocab(params, h.vocab_size)
        return ids

    def cancel(self, request_id: str) -> None:
        self.scheduler.finish(request_id)
        gen = self._generations.pop(request_id, None)
        if gen is not None:
            gen.close()

    def step(self) -> list[Event]:
        """One forward pass for every scheduled request; the events it produced."""
        plan = self.scheduler.plan()
        events: list[Event] = [self._exhausted(rid) for rid in plan.exhausted]
        if not plan.chunks:
            return events
        try:
            logits = self.runner.forward(plan.chunks)
        except InferenceError as exc:  # the pass is shared: every request in it fails
            return events + [self._fail(c.seq_id, exc) for c in plan.chunks]
        rows = iter(logits)
        for chunk in plan.chunks:
            if chunk.sample:
                events += self._accept(chunk.seq_id, next(rows))
        return events

    def _accept(self, request_id: str, logits) -> list[Event]:
        gen = self._generations[request_id]
        try:
            delta = gen.feed(logits)
        except OvpoolError as exc:
            return [self._fail(request_id, exc)]
        events: list[Event] = [] if delta is None else [Token(request_id, delta)]
        if gen.finished:
            events.append(Finished(request_id, gen.completion()))
            self.cancel(request_id)
        else:
            self.scheduler.append(request_id, gen.token_ids[-1])
        return events

    def _exhausted(self, request_id: str) -> Event:
        size = self.scheduler.num_blocks * self.scheduler.block_size
        return self._fail(request_id, InvalidRequestError(
            f"the sequence outgrew the KV cache ({size} positions); raise kv_cache_mb or lower max_tokens"))

    def _fail(self, request_id: str, error: OvpoolError) -> Event:
        self.cancel(request_id)
        return Failed(request_id, error)

