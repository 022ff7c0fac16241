"""Engine: a GGUF model compiled for one OpenVINO device, with its tokenizer, ready to generate.

A thin facade over three parts: ``graphs`` (ovpool.worker.graphs: which graph, loaded through the
compiled-model cache, and the paged graph a Batcher runs), ``intake``
(ovpool.worker.generate.intake: prompts into checked token ids and constraints) and a Batcher on
the paged graph that runs single streams as requests of one batch (ovpool.worker.generate.streams):
several generations can be interleaved, and a chat's next turn reuses the KV blocks of the last
one (the Batcher's prefix cache, ``prefix_cache``). Where the engine's graph is not the paged one,
generations run on the compatibility seam, ``Engine._stateful_seam``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from ovpool.cache import budget, kv, prefetch
from ovpool.completion import Completion, Delta
from ovpool.config import WorkerConfig
from ovpool.devices import check_usable
from ovpool.errors import ModelLoadError
from ovpool.sampling_params import SamplingParams
from ovpool.settings import Settings
from ovpool.worker import heap
from ovpool.worker.exact_modes import exact_prefix_cache, resolve_prompt_lookup
from ovpool.worker.generate.batch import PagedGraph, PagedRunner, PagedSession
from ovpool.worker.generate.batcher import Batcher
from ovpool.worker.generate.constraint import Constraint, Vocabulary
from ovpool.worker.generate.generation import Generation
from ovpool.worker.generate.intake import Admitted, Intake, Limits, Prompt, timed
from ovpool.worker.generate.session import Session, warm_up
from ovpool.worker.generate.streams import Stream, Streams
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.graphs import Graphs
from ovpool.worker.opened import OpenedModel
from ovpool.worker.text.chat import TEMPLATE_KEY, check_messages
from ovpool.worker.text.tokenizer import Tokenizer

__all__ = ["Engine", "Prompt"]


class Engine:
    """``Engine(model, device, settings, cache_dir, cache_only)``; ``model`` is a GGUF path or alias.

    ``device``, ``cache_dir`` and ``cache_only`` left as None come from ``settings`` (flag >
    environment > default, see ``ovpool settings``): the compiled model is cached by default in
    ``$XDG_CACHE_HOME/ovpool`` (else ``~/.cache/ovpool``), as every ``ovpool`` command does;
    ``cache_dir=""`` (or the setting ``cache_dir=""``) compiles without a cache. ``early``: the
    import ``prefetch.start`` began for this engine (ovpool's commands begin it before importing
    the engine's modules); the engine takes it over, and begins its own without one.
    """

    def __init__(self, model: str | Path, device: str | None = None,
                 settings: Settings | Mapping[str, Any] | None = None,
                 cache_dir: str | Path | None = None, cache_only: bool | None = None,
                 early: prefetch.BlobImport | None = None, opened: OpenedModel | None = None):
        self.settings = Settings.coerce(settings)
        if cache_dir is not None:  # "" too: no cache, for every graph and the prefetch
            self.settings = self.settings.replace(cache_dir=str(cache_dir))
        self.device = device or self.settings.device
        self.core = ov.Core()
        cache_dir = self.settings.cache_dir or None
        cache_only = self.settings.cache_only if cache_only is None else cache_only
        self.config = WorkerConfig.of(self.settings)  # what the engine reads of its settings, typed
        # A likely cache hit imports (OpenVINO releases the GIL) while the GGUF header is read.
        early = early or prefetch.start(model, self.device, self.settings, cache_dir, self.core)
        phases: dict[str, float] = {}
        self._load(model, opened, phases, cache_dir=cache_dir, cache_only=cache_only, early=early)
        self.load_report = {"outcome": self.graphs.own.outcome, "entry": self.graphs.own.entry,
                            "seconds": phases, "graph_settings": self.graphs.graph_settings,
                            "chat": bool(self.model.metadata.get(TEMPLATE_KEY))}
        h, s = self.model.hparams, self.config
        self.intake = Intake(self.tokenizer, self.model.metadata.get(TEMPLATE_KEY),
                             Limits(h.vocab_size, h.context_length, s.max_prompt_tokens, s.max_new_tokens),
                             phases)
        self._idle: list[Session | PagedSession] = []
        self._single: Streams | None = None  # the single streams on the paged graph, see _streams
        self._prefix_auto: str | None = None  # what prefix_cache=auto means here, once known
        self._tiers: list[kv.DiskTier | kv.RamTier] = []  # the KV tiers of its Batchers (see _kv_tier)
        # Whether its Batchers read and write the host's KV tier (the broker routes by it).
        self.load_report["kv_tier"] = bool(self.config.kv_tier and self.cache_dir
                                           and self.prefix_cache == "on")
        self.warmed = False
        if self.config.warm_up == "load":
            self.warm_up()

    def _load(self, model: str | Path, opened: OpenedModel | None, phases: dict[str, float],
              **graphs: Any) -> None:
        """The GGUF (or ``opened``'s), its tokenizer and its graphs (``graphs``: Graphs' keywords),
        each phase's seconds in ``phases``; then the file unmapped and the heap trimmed."""
        with timed(phases, "open"):
            self.model = opened.model if opened is not None else GGUFModel.open(model)
        with timed(phases, "tokenizer"):
            self.tokenizer = opened.tokenizer if opened is not None else Tokenizer.from_metadata(
                self.model.metadata)
        try:
            self.graphs = Graphs(self.model, self.config, self.device, self.core, **graphs)
        except (RuntimeError, ModelLoadError):  # checked now: probing first would delay starts
            check_usable(self.core, self.device)  # one that is not there says so, in one line
            raise
        # The compiled model holds its own weights: unmapping the file frees its pages (~its size).
        self.model.close()
        heap.trim()  # the build's freed temporaries, before the warm-up's layouts raise the peak
        if self.graphs.own.outcome.endswith("wrote"):
            self._keep_cache_within()
        phases["compiled model"] = self.graphs.own.seconds

    @property
    def attention(self) -> str:
        return self.graphs.attention

    @property
    def cache_dir(self) -> str | None:
        """The compiled-model cache this engine's graphs go through; None: no cache."""
        return self.graphs.cache_dir

    @property
    def graph_settings(self) -> dict[str, Any]:
        return self.graphs.graph_settings

    @property
    def load_result(self):
        """The engine's graph as it was loaded (ovpool.cache.loader.LoadResult)."""
        return self.graphs.own

    @property
    def compiled(self) -> ov.CompiledModel:
        return self.graphs.own.compiled

    def paged_graph(self) -> PagedGraph:
        """The paged graph to batch with (``graphs.paged_graph``); how it came is in
        ``load_report["paged"]``."""
        graph = self.graphs.paged_graph()
        if "paged" not in self.load_report and graph.outcome.endswith("wrote"):
            self._keep_cache_within()
        self.load_report["paged"] = {"outcome": graph.outcome, "entry": graph.entry,
                                     "seconds": graph.seconds}
        return graph

    def batcher(self, runner: PagedRunner | None = None, *, max_running: int,
                prefill_chunk: int | None = None, prefix_cache: str | None = None,
                answer_copies: bool | None = None, answer_tails: bool | None = None) -> Batcher:
        """A Batcher of this engine's requests on ``runner`` (default: the paged graph with
        ``kv_cache_mb`` of blocks); unset values come from the engine's config."""
        options = {"max_running": max_running, "prefix_cache": prefix_cache or self.prefix_cache,
                   "prefill_chunk": prefill_chunk or self.config.prefill_chunk,
                   "warm_up": self._warm_up_paged, "prompt_lookup": self.prompt_lookup,
                   "lookup_tokens": self.config.prompt_lookup_tokens,
                   "answer_copies": self.config.answer_copies if answer_copies is None else answer_copies,
                   "answer_tails": self.config.answer_tails if answer_tails is None else answer_tails}
        if runner is not None:
            return Batcher(self.intake, runner, identity=self.graphs.paged_identity,
                           tier=self._kv_tier(self.load_result.entry, options["prefix_cache"]), **options)
        graph = self.paged_graph()
        return Batcher.from_graph(self.intake, graph, kv_cache_mb=self.config.kv_cache_mb,
                                  tier=self._kv_tier(graph.entry, options["prefix_cache"]), **options)

    def _kv_tier(self, entry: str | None, prefix_cache: str) -> kv.DiskTier | kv.RamTier | None:
        """The host's disk KV tier of the paged graph of cache entry ``entry`` under kv_ram_mb of
        RAM (setting kv_tier; exact blocks only, so with prefix_cache=on), closed with the engine;
        None if off."""
        if not self.config.kv_tier or prefix_cache != "on":
            return None
        tier = kv.open_tier(self.cache_dir, entry, self.config.kv_tier_mb, dir_check=self._keep_cache_within,
                            ram_mb=self.config.kv_ram_mb)
        if tier is not None:
            self._tiers.append(tier)
        return tier

    def _keep_cache_within(self) -> None:
        """The cache directory within cache_max_mb, least recently used out (ovpool.cache.budget);
        after each load (an export may have grown it) and as the KV tier writes. Not in
        cache-only mode, which changes nothing in the cache."""
        if not self.graphs.cache_only:
            budget.keep_within(self.cache_dir, self.config.cache_max_mb)

    def _warm_up_paged(self) -> None:
        """The paged graph's set-up: the engine's own warm-up where it is the engine's graph."""
        if self.attention == "paged":
            self.warm_up()
        else:
            graph = self.graphs.paged_graph()
            warm_up(PagedSession(graph.compiled, graph.decode))

    def serve_on_paged(self) -> None:
        """From now on run single streams on the graph ``paged_graph`` handed out (a worker's
        batching graph), and let go of the engine's own (``graphs.serve_on_paged``). Only once no
        generation runs on the old graph; nothing before ``paged_graph``, or where the paged
        graph is the engine's own."""
        if not self.graphs.switchable:
            return
        self._idle.clear()  # sessions of the old graph: before its blob goes
        self._single = None
        self.graphs.serve_on_paged()
        self.warmed = False  # the next warm-up sets the paged graph's kernels (and decode graph) up

    def batching_plan(self) -> str:
        return self.graphs.batching_plan()

    def warm_up(self) -> None:
        """Set the device's kernels up now (once; seconds in ``load_report``), not in a request
        (see session.warm_up). Worth it before requests arrive; a process that generates once
        (``ovpool generate``) gains nothing from it."""
        if self.warmed:
            return
        with timed(self.load_report["seconds"], "warm-up"):
            if self.load_result.arena is not None:
                self.load_result.arena.burst()  # the first passes read every constant
            session = self._acquire()
            warm_up(session)
            self._release(session)
        self.warmed = True

    @property
    def prefix_cache(self) -> str:
        """How generations reuse KV computed for an earlier sequence (setting ``prefix_cache``):
        ``on`` (exact), ``all`` or ``off``; ``auto`` is ``on`` where that was measured to leave every
        answer as without the cache (docs/prefix-caching.md), else ``off``."""
        if self.config.prefix_cache != "auto":
            return self.config.prefix_cache
        if self._prefix_auto is None:
            self._prefix_auto = exact_prefix_cache(self.device, self.graph_settings)
        return self._prefix_auto

    @property
    def prompt_lookup(self) -> str:
        """Setting ``prompt_lookup``; ``auto`` is off but at f32, where a pass over several
        positions computes each row as a one-position pass does (docs/prompt-lookup.md)."""
        return resolve_prompt_lookup(self.config.prompt_lookup, self.graph_settings)

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def hparams(self):
        return self.model.hparams

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special)

    def detokenize(self, ids: Sequence[int], skip_special: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special=skip_special)

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """Token ids of a text, a list of ids, or chat messages (rendered with the chat template)."""
        return self.intake.prompt_ids(prompt)

    def render_chat(self, messages: Sequence[Mapping[str, Any]]) -> str:
        return self.intake.render_chat(messages)

    def admit(self, prompt: Prompt, params: SamplingParams) -> list[int]:
        """The prompt's token ids, once the request is within every limit (ovpool.worker.generate.limits)."""
        return self.intake.ids(prompt, params)

    def constraint(self, params: SamplingParams) -> Constraint | None:
        return self.intake.constraint(params)

    def vocabulary(self) -> Vocabulary:
        return self.intake.vocabulary()

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits: row i scores the token after ``ids[:i + 1]``; float32 [len(ids), vocab]."""
        ids = self.prompt_ids(ids)
        self.intake.check(ids, new_tokens=0)
        session = self._acquire()
        try:
            return np.array(session.forward(ids, logits_from=0), dtype=np.float32)
        finally:
            self._release(session)

    def generation(self, prompt: Prompt, params: SamplingParams | None = None,
                   prefill_chunk: int | None = None) -> Stream | Generation:
        """A generation to drive with ``step()``: a request of the engine's Batcher on the paged
        graph (``prefill_chunk`` tokens of a prompt per pass, the setting), else on the
        compatibility seam (``_stateful_seam``), where ``prefill_chunk`` splits a long prompt."""
        admitted = self.intake.admit(prompt, params or SamplingParams())
        if self.attention == "paged":
            return self._streams().open(admitted)
        return self._stateful_seam(admitted, prefill_chunk)

    def _streams(self) -> Streams:
        """The single streams' Batcher, made on first use: ``slots`` at once, ``kv_cache_mb`` of KV
        blocks, and at least enough for the longest sequence a request may make."""
        if self._single is None:
            runner = PagedRunner(self.compiled, self.config.kv_cache_mb, decode=self.load_result.decode)
            c = self.config
            longest = min(self.hparams.context_length, c.max_prompt_tokens + c.max_new_tokens) + 1
            runner.grow(max(runner.num_blocks, -(-longest // runner.block_size)))
            self._single = Streams(self.batcher(runner, max_running=self.config.slots))
        return self._single

    def _stateful_seam(self, admitted: Admitted, prefill_chunk: int | None) -> Generation:
        """THE compatibility seam: a generation on a graph other than the paged one, on an
        InferRequest of its own (no prefix cache: see Session). Only where no paged graph serves:
        a worker's start-up with a cache on a device that cannot re-import a compiled paged graph
        (it imports the stateful one, and moves to the paged graph once that is compiled from the
        cache's IR: ``serve_on_paged``), and the settings attention=sdpa|manual or stateful=false
        (devices without PagedAttention). Remove it, with ovpool/cache/ir.py and
        ``backend.Interleaved``, once the OpenVINO that ovpool requires re-imports compiled paged
        graphs (``graph.loading.reimport_problem`` is None; 2026.4's CPU plugin cannot) and every
        supported device runs PagedAttention."""
        return Generation(self._acquire(), self._release, admitted.ids, admitted.params,
                          self.tokenizer, context_length=self.hparams.context_length,
                          prefill_chunk=prefill_chunk, constraint=admitted.constraint,
                          tools=self.intake.tool_reader(admitted.params))

    def stream(self, prompt: Prompt, **sampling: Any) -> Iterator[Delta]:
        with self.generation(prompt, SamplingParams.from_dict(sampling)) as gen:
            yield from gen

    def complete(self, prompt: Prompt, **sampling: Any) -> Completion:
        with self.generation(prompt, SamplingParams.from_dict(sampling)) as gen:
            for _ in gen:
                pass
            return gen.completion()

    def chat(self, messages: Sequence[Mapping[str, Any]], **sampling: Any) -> Completion:
        return self.complete(check_messages(messages), **sampling)

    def _acquire(self) -> Session | PagedSession:
        """An idle session of the engine's graph (for logits, warm-ups and the seam), or a new one."""
        if self._idle:
            return self._idle.pop()
        if self.attention == "paged":
            return PagedSession(self.compiled, self.load_result.decode)
        return Session(self.compiled.create_infer_request())

    def _release(self, session: Session | PagedSession) -> None:
        session.reset()
        self._idle.append(session)

    def close(self) -> None:
        self._idle.clear()
        self._single = None
        for tier in self._tiers:  # its pending blocks are written first
            tier.close()
        self.graphs.close()  # last: a hit's compiled model runs on its mapped blob
        self.model.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

