"""The compiled graphs of one engine's model: the one it starts on and the paged one a Batcher runs.

``Graphs`` chooses the single-stream graph (paged or stateful, ovpool.worker.graph.loading) and
gets it through the compiled-model cache; ``paged_graph()`` hands out the paged graph, as the small
typed ``PagedGraph`` a Batcher takes (no cache type crosses into ovpool.worker.generate): the
engine's own graph when it is paged, else one loaded through the cache. ``serve_on_paged()`` lets
the start-up graph go once the paged one serves. Every graph loaded stays here until ``close()``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import openvino as ov

from ovpool.cache import prefetch
from ovpool.cache.loader import LoadResult
from ovpool.config import WorkerConfig
from ovpool.worker.generate.batch import PagedGraph
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.graph import compile_settings, loading


class Graphs:
    """``Graphs(model, config, device, core, cache_dir, cache_only, early)``: the engine's
    graph loaded (``own``); ``early``: see ovpool.cache.prefetch (closed here if stale)."""

    def __init__(self, model: GGUFModel, config: WorkerConfig, device: str, core: ov.Core, *,
                 cache_dir: str | Path | None, cache_only: bool, early: prefetch.BlobImport | None):
        self.model, self.config, self.device, self.core = model, config, device, core
        self.cache_dir, self.cache_only = cache_dir, cache_only
        self.attention = loading.choose_attention(config.graph, device, core, cache_dir)
        self.graph_settings = {**compile_settings.resolve_auto(config.graph, device, core),
                               "attention": self.attention}
        self.own = loading.load_graph(model, config.with_graph(attention=self.attention), device, core,
                                      cache_dir=cache_dir, cache_only=cache_only,
                                      hint=prefetch.hint_key(model.path, device, config.graph), early=early)
        if early is not None and self.own.blob is not early:
            early.close()  # a stale hint: another blob (or none) was loaded
        self.held = [self.own]  # every graph loaded: closed with this
        self._paged: LoadResult | None = None

    def paged_graph(self) -> PagedGraph:
        """The paged graph to batch with: the engine's own if it runs one (outcome ``shared``),
        else loaded through the cache (once)."""
        if self._paged is None:
            if self.attention == "paged":
                self._paged = dataclasses.replace(self.own, outcome="shared", seconds=0.0)
            else:
                self._paged = loading.load_paged(self.model, self.config, self.device, self.core,
                                                 cache_dir=self.cache_dir, cache_only=self.cache_only)
                self.held.append(self._paged)
                self.model.close()  # as after the engine's own graph: the compiled one holds its weights
        paged = self._paged
        return PagedGraph(paged.compiled, paged.decode, self.paged_identity, paged.outcome, paged.entry,
                          paged.seconds)

    @property
    def paged_identity(self) -> bytes:
        """The paged graph's identity: model file, device, graph settings (KV blocks of two models
        or two precisions never share an address, see ovpool.worker.generate.blocks)."""
        settings = {**self.graph_settings, "attention": "paged"}
        identity = (str(self.model.path), self.device, sorted(settings.items()))
        return hashlib.blake2b(repr(identity).encode(), digest_size=16).digest()

    @property
    def switchable(self) -> bool:
        """Whether ``serve_on_paged`` would switch: the paged graph was handed out and is not the
        engine's own."""
        return self._paged is not None and self._paged.compiled is not self.own.compiled

    def serve_on_paged(self) -> None:
        """Make the paged graph the engine's own and let go of the start-up one with its blob's
        mapping and kernel layouts (docs/performance.md). Only once nothing runs on the old graph."""
        if not self.switchable:
            return
        old, self.own = self.own, self._paged
        self.attention = self.graph_settings["attention"] = "paged"
        self.held.remove(old)
        owners = [owner for owner in (old.blob, old.arena) if owner is not None]
        del old  # then the blob's import lets go of the compiled model before its mapping goes
        for owner in owners:
            owner.close()

    def batching_plan(self) -> str:
        """Whether a worker of this engine batches, and how it gets its batching graph, in one
        plain line (``ovpool status``; ovpool.worker.graph.loading.batching_plan)."""
        if self.attention == "paged" and self.config.batching == "paged":
            return "on (the engine's own graph)"
        return loading.batching_plan(self.model, self.config, self.device, self.core,
                                     cache_dir=self.cache_dir, cache_only=self.cache_only)

    def close(self) -> None:
        for result in self.held:  # a hit's compiled model runs on its mapped blob
            result.close()
        self.held.clear()
