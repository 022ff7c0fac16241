"""Engine: a GGUF model compiled for one OpenVINO device, with its tokenizer, ready to generate.

Loading opens the GGUF header, resolves the effective graph settings, chooses the graph (paged or
stateful, see ovpool.worker.graph.loading) and gets it compiled through the compiled-model cache (a hit
never builds the graph or reads a weight). Each Generation borrows a session (an InferRequest with
its own KV cache) from a pool, so several can be interleaved; finished sessions are reused. With the
prefix cache on (``prefix_cache``) a finished session keeps its KV, and the next generation whose
prompt begins with that session's tokens (a chat's next turn) computes only the rest.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from ovpool.cache import prefetch
from ovpool.cache.loader import LoadResult
from ovpool.completion import Completion, Delta
from ovpool.devices import device_type
from ovpool.errors import InvalidRequestError
from ovpool.sampling_params import SamplingParams
from ovpool.settings import Settings
from ovpool.worker.generate.batch import PagedSession
from ovpool.worker.generate.constraint import Vocabulary
from ovpool.worker.generate.generation import Generation
from ovpool.worker.generate.limits import check_logit_bias, check_max_tokens, check_prompt, check_prompt_chars
from ovpool.worker.generate.session import Session, warm_up
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.graph import builder as graph
from ovpool.worker.graph import loading
from ovpool.worker.graph.cpu_class import CpuInfo
from ovpool.worker.text.chat import check_messages, render
from ovpool.worker.text.tokenizer import Tokenizer

Prompt = str | Sequence[int] | Sequence[Mapping[str, Any]]


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
                 early: prefetch.BlobImport | None = None):
        self.settings = Settings.coerce(settings)
        if cache_dir is not None:  # "" too: no cache, for every graph and the prefetch
            self.settings = self.settings.replace(cache_dir=str(cache_dir))
        self.device = device or self.settings.device
        self.core = ov.Core()
        # Kept: other graphs of this model (the worker's paged graph) use the same cache.
        self.cache_dir = self.settings.cache_dir or None
        self.cache_only = self.settings.cache_only if cache_only is None else cache_only
        # A likely cache hit imports (OpenVINO releases the GIL) while the GGUF header is read.
        early = early or prefetch.start(model, self.device, self.settings, self.cache_dir, self.core)
        phases: dict[str, float] = {}
        with _phase(phases, "open"):
            self.model = GGUFModel.open(model)
        with _phase(phases, "tokenizer"):
            self.tokenizer = Tokenizer.from_metadata(self.model.metadata)
        self.attention = loading.choose_attention(self.settings, self.device, self.core, self.cache_dir)
        self.graph_settings = {**graph.resolve_auto(self.settings, self.device, self.core),
                               "attention": self.attention}
        self.load_result = result = self._load(early)
        if early is not None and result.blob is not early:
            early.close()  # a stale hint: another blob (or none) was loaded
        self._graphs = [result]  # every graph this engine loaded: closed with it
        self.compiled = result.compiled
        # The compiled model holds its own weights: unmapping the file frees its pages (~its size).
        self.model.close()
        phases["compiled model"] = result.seconds
        self.load_report = {"outcome": result.outcome, "entry": result.entry, "seconds": phases,
                            "graph_settings": self.graph_settings}
        self._idle: list[Session | PagedSession] = []
        self._paged: LoadResult | None = None  # the paged graph handed out by ``paged_graph``
        self._vocabulary = None  # for constrained decoding, made on the first request with one
        self._vocabulary_lock = threading.Lock()
        self._longest_token: int | None = None  # characters: bounds a prompt before tokenizing it
        self._prefix_auto: str | None = None  # what prefix_cache=auto means here, once known
        self.warmed = False
        if self.settings.warm_up == "load":
            self.warm_up()

    def _load(self, early: prefetch.BlobImport | None) -> LoadResult:
        return loading.load_graph(self.model, self.settings.replace(attention=self.attention),
                                  self.device, self.core, cache_dir=self.cache_dir,
                                  cache_only=self.cache_only,
                                  hint=prefetch.hint_key(self.model.path, self.device, self.settings),
                                  early=early)

    def paged_graph(self) -> LoadResult:
        """The paged graph to batch with (ovpool.worker.generate.batcher): the engine's own if it
        runs one (outcome ``shared``), else loaded through the cache; it stays the engine's (closed
        with it), and how it came is in ``load_report["paged"]``."""
        if self.attention == "paged":
            result = dataclasses.replace(self.load_result, outcome="shared", seconds=0.0)
        else:
            result = loading.load_paged(self.model, self.settings, self.device, self.core,
                                        cache_dir=self.cache_dir, cache_only=self.cache_only)
            self._graphs.append(result)
            self.model.close()  # as after the engine's own graph: the compiled one holds its weights
        self.load_report["paged"] = {"outcome": result.outcome, "entry": result.entry,
                                     "seconds": result.seconds}
        self._paged = result
        return result

    def serve_on_paged(self) -> None:
        """From now on run single streams on the graph ``paged_graph`` handed out (a worker's
        batching graph), and let go of the engine's own: the stateful graph a cache hit imported,
        with its kernel layouts (warm-cache SmolLM2 worker, AVX-512 VNNI/BF16: RSS 604 -> 492 MiB
        after its idle warm-up). Only once no generation runs on the old graph; nothing before
        ``paged_graph``, or where the paged graph is the engine's own."""
        paged, old = self._paged, self.load_result
        if paged is None or paged.compiled is old.compiled:
            return
        self._idle.clear()  # sessions of the old graph
        self.load_result, self.compiled = paged, paged.compiled
        self.attention = self.graph_settings["attention"] = "paged"
        self.warmed = False  # the next warm-up sets the paged graph's kernels (and decode graph) up
        self._graphs.remove(old)
        owners = [owner for owner in (old.blob, old.arena) if owner is not None]
        del old  # then the blob's import lets go of the compiled model before its mapping goes
        for owner in owners:
            owner.close()

    def batching_plan(self) -> str:
        """Whether a worker of this engine batches, and how it gets its batching graph, in one
        plain line (``ovpool status``; ovpool.worker.graph.loading.batching_plan)."""
        if self.attention == "paged" and self.settings.batching == "paged":
            return "on (the engine's own graph)"
        return loading.batching_plan(self.model, self.settings, self.device, self.core,
                                     cache_dir=self.cache_dir, cache_only=self.cache_only)

    def warm_up(self) -> None:
        """Set the device's kernels up now (once; seconds in ``load_report``), not in a request
        (see session.warm_up). Worth it before requests arrive; a process that generates once
        (``ovpool generate``) gains nothing from it."""
        if self.warmed:
            return
        with _phase(self.load_report["seconds"], "warm-up"):
            session = self._acquire()
            warm_up(session)
            self._release(session)
        self.warmed = True

    @property
    def prefix_cache(self) -> str:
        """How generations reuse KV computed for an earlier sequence (setting ``prefix_cache``):
        ``on`` (exact), ``all`` or ``off``; ``auto`` is ``on`` where that was measured to leave every
        answer as without the cache (docs/prefix-caching.md), else ``off``."""
        if self.settings.prefix_cache != "auto":
            return self.settings.prefix_cache
        if self._prefix_auto is None:
            self._prefix_auto = _exact_prefix_cache(self.device, self.graph_settings)
        return self._prefix_auto

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
        if isinstance(prompt, str):
            return self._tokenize_checked(prompt)
        items = list(prompt)
        if items and all(isinstance(m, Mapping) for m in items):
            # The template writes any BOS itself, as Hugging Face's apply_chat_template does.
            return self._tokenize_checked(self.render_chat(items), add_special=False)
        if all(isinstance(t, int | np.integer) and not isinstance(t, bool) for t in items):
            return [int(t) for t in items]
        raise InvalidRequestError("a prompt is a string, a list of token ids, or a list of chat messages "
                                  "({'role': ..., 'content': ...})")

    def _tokenize_checked(self, text: str, add_special: bool = True) -> list[int]:
        if self._longest_token is None:  # a token string has at least one character per byte
            self._longest_token = max(map(len, self.tokenizer.tokens), default=1)
        check_prompt_chars(len(text), self.settings.max_prompt_tokens, self._longest_token)
        return self.tokenize(text, add_special=add_special)

    def render_chat(self, messages: Sequence[Mapping[str, Any]]) -> str:
        return render(self.model.metadata.get("tokenizer.chat_template"), messages,
                      add_generation_prompt=True, bos_token=self.tokenizer.bos_token,
                      eos_token=self.tokenizer.eos_token)

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits: row i scores the token after ``ids[:i + 1]``; float32 [len(ids), vocab]."""
        ids = self.prompt_ids(ids)
        self._check(ids, new_tokens=0)
        session = self._acquire()
        try:
            return np.array(session.forward(ids, logits_from=0), dtype=np.float32)
        finally:
            self._release(session)

    def admit(self, prompt: Prompt, params: SamplingParams) -> list[int]:
        """The prompt's token ids, once the request is within every limit (ovpool.worker.generate.limits)."""
        check_max_tokens(params.max_tokens, self.settings.max_new_tokens)
        ids = self.prompt_ids(prompt)
        self._check(ids, new_tokens=1, max_tokens=params.max_tokens)
        check_logit_bias(params.logit_bias, self.hparams.vocab_size)
        return ids

    def generation(self, prompt: Prompt, params: SamplingParams | None = None,
                   prefill_chunk: int | None = None) -> Generation:
        """A Generation to drive with ``step()``; ``prefill_chunk`` splits a long prompt over steps."""
        params = params or SamplingParams()
        ids = self.admit(prompt, params)
        return Generation(self._acquire(ids), self._release, ids, params, self.tokenizer,
                          context_length=self.hparams.context_length, prefill_chunk=prefill_chunk,
                          constraint=self.constraint(params))

    def constraint(self, params: SamplingParams):
        """The Constraint of ``params.response_format`` on this model's vocabulary; None without one."""
        if params.response_format is None:
            return None
        return self.vocabulary().constraint(params.response_format, ignore_eos=params.ignore_eos)

    def vocabulary(self) -> Vocabulary:
        """This model's vocabulary for constrained decoding, built on first use (a batcher's
        constraint thread may ask for it while a single stream does)."""
        with self._vocabulary_lock:
            if self._vocabulary is None:
                with _phase(self.load_report["seconds"], "structured-output vocabulary"):
                    self._vocabulary = Vocabulary(self.tokenizer)
            return self._vocabulary

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

    def _check(self, ids: Sequence[int], new_tokens: int, max_tokens: int | None = None) -> None:
        check_prompt(ids, vocab_size=self.hparams.vocab_size, context_length=self.hparams.context_length,
                     max_prompt_tokens=self.settings.max_prompt_tokens, new_tokens=new_tokens,
                     max_tokens=max_tokens)

    def _acquire(self, ids: Sequence[int] = ()) -> Session | PagedSession:
        """An idle session, the one whose cache keeps the most of ``ids``'s beginning (prefix
        cache), with that much cached (``past``); a new one if none is idle."""
        if self._idle:
            mode = self.prefix_cache
            keep = [0 if mode == "off" else s.reusable(ids, exact=mode == "on") for s in self._idle]
            session = self._idle.pop(best := keep.index(max(keep)))
            session.resume(keep[best])
            return session
        if self.attention == "paged":
            return PagedSession(self.compiled, self.load_result.decode)
        return Session(self.compiled.create_infer_request())

    def _release(self, session: Session | PagedSession) -> None:
        if self.prefix_cache == "off":
            session.reset()
        self._idle.append(session)

    def close(self) -> None:
        self._idle.clear()
        self.compiled = None
        for result in self._graphs:  # last: a hit's compiled model runs on its mapped blob
            result.close()
        self._graphs.clear()
        self.model.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _exact_prefix_cache(device: str, graph_settings: Mapping[str, Any]) -> str:
    """``on`` where a prompt pass computes each position's keys, values and logits the same
    whatever else the pass holds (so reused KV is a fresh run's, bit for bit), else ``off``:
    measured at f32 and at bf16 on the AVX-512 VNNI/BF16 class (SmolLM2: passes of 2 to 128 rows,
    every layer's KV identical), and the f32 tests check it on every class CI runs on; bf16 on AMX
    is unmeasured. A u8 KV cache's per-block scales depend on how a block filled."""
    precision = graph_settings["inference_precision"]
    if device_type(device) != "CPU" or graph_settings["kv_cache_precision"] == "u8":
        return "off"
    if precision == "f32" or (precision == "bf16" and CpuInfo.read().class_name == "AVX-512 VNNI/BF16"):
        return "on"
    return "off"


class _phase:
    """Adds the seconds spent in a ``with`` block to ``phases[name]``."""

    def __init__(self, phases: dict[str, float], name: str):
        self.phases, self.name = phases, name

    def __enter__(self):
        self._t0 = time.perf_counter()

    def __exit__(self, *exc):
        self.phases[self.name] = time.perf_counter() - self._t0
