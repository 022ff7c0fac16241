"""The OpenVINO side of continuous batching: the compiled paged graph, its KV blocks, one pass per Plan.

``load_paged`` gets the paged graph (ovpool.worker.paged) through the compiled-model cache like
any other graph: its ports differ from the engine's, so it has its own exact cache entry.
``PagedRunner`` allocates the KV block tensors once (their element type and layout are what the
compiled model asks for) and turns a scheduler Plan into the op's inputs for one forward pass.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import SimpleNamespace

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from ovpool.cache.loader import LoadResult, load_compiled
from ovpool.errors import CacheUnsupportedError, ModelLoadError
from ovpool.worker import graph
from ovpool.worker.engine import cache_identity
from ovpool.worker.paged import PagedAttention
from ovpool.worker.scheduler import Chunk

_MIB = 1 << 20
log = logging.getLogger("ovpool.worker")


def load_paged(engine) -> LoadResult:
    """The paged graph of ``engine``'s model, for its device, graph settings and cache."""
    attention = PagedAttention()
    identity, config = cache_identity(engine.model, engine.settings, engine.device, engine.core, attention)
    settings = dict(identity.settings)
    cache_dir = engine.cache_dir
    if cache_dir and (why := reimport_problem(engine.core, engine.device)):
        if engine.cache_only:
            raise CacheUnsupportedError(f"cache-only mode cannot load the paged graph: {why}")
        log.info("model cache: not used for the paged graph: %s", why)
        cache_dir = None
    return load_compiled(engine.core, identity=identity, device=engine.device, config=config,
                         build=lambda: graph.build_model(engine.model, settings, attention),
                         cache_dir=cache_dir, cache_only=engine.cache_only)


_REIMPORT: dict[str, str | None] = {}
_TYPES = {"i32": ov.Type.i32, "i64": ov.Type.i64, "dynamic": ov.Type.dynamic}


def reimport_problem(core: ov.Core, device: str) -> str | None:
    """Why ``device``'s plugin cannot import an exported paged-attention graph; None if it can.

    OpenVINO 2026.4's CPU plugin needs the op's head sizes from node rt_info, which an exported blob
    does not keep; a cached paged graph would then fail at every start. Probed once per device on a
    one-layer graph (~0.1 s), so a fixed OpenVINO gets the cache with no change here.
    """
    if device not in _REIMPORT:
        compiled = core.compile_model(_probe_model(), device)
        with compiled.export_model() as stream:
            blob = stream.getvalue()
        try:
            core.import_model(blob, device)
            _REIMPORT[device] = None
        except RuntimeError as exc:
            reason = [line for line in str(exc).splitlines() if line.strip()][-1]
            _REIMPORT[device] = f"OpenVINO {ov.get_version()} cannot re-import it: {reason}"
    return _REIMPORT[device]


def _probe_model() -> ov.Model:
    attention = PagedAttention()
    params = {p["name"]: ops.parameter(ov.PartialShape(p["partial_shape"]), _TYPES[p["element_type"]],
                                       name=p["name"])
              for p in attention.ports(SimpleNamespace(n_layers=1))}
    x = ops.parameter([1, 1, -1, 8], ov.Type.f32, name="x")  # [batch, heads, tokens, head_dim]
    out = attention.attend(params, 0, x.output(0), x.output(0), x.output(0))
    return ov.Model([ops.result(out)], [x, *params.values()])


class PagedRunner:
    """One InferRequest over ``compiled`` with ``kv_cache_mb`` MiB of KV blocks (at least one),
    or exactly ``num_blocks`` blocks."""

    def __init__(self, compiled: ov.CompiledModel, kv_cache_mb: int = 0, num_blocks: int = 0):
        self.request = compiled.create_infer_request()
        caches = [p for p in compiled.inputs if "_cache." in p.get_any_name()]
        dims = {p.get_any_name(): [d.get_length() for d in list(p.get_partial_shape())[1:]] for p in caches}
        # u8 caches keep scales inside the block, so the value cache's third dim is the block size.
        self.block_size = dims["value_cache.0"][1]
        block_bytes = sum(int(np.prod(dims[p.get_any_name()])) * p.get_element_type().size for p in caches)
        self.num_blocks = num_blocks or max(1, kv_cache_mb * _MIB // block_bytes)
        self.kv_bytes = self.num_blocks * block_bytes
        self._caches = {p.get_any_name(): ov.Tensor(p.get_element_type(),
                                                   ov.Shape([self.num_blocks, *dims[p.get_any_name()]]))
                        for p in caches}
        for name, tensor in self._caches.items():
            # Zeroed, as GenAI does: vector kernels multiply the unused tail of a block by zero,
            # and NaN garbage in fresh memory would survive that (NaN * 0 = NaN).
            tensor.data.fill(0)
            self.request.set_tensor(name, tensor)

    def forward(self, chunks: Sequence[Chunk]) -> np.ndarray:
        """Run every chunk in one pass; logits [sampled chunks, vocab] in chunk order.

        The array is the request's output buffer: valid until the next forward pass.
        """
        for name, array in feeds(chunks).items():
            self.request.set_tensor(name, ov.Tensor(array))
        try:
            self.request.infer()
        except RuntimeError as exc:
            raise ModelLoadError(f"batched inference failed ({len(chunks)} sequences): {exc}") from exc
        return self.request.get_tensor("logits").data[0]


def feeds(chunks: Sequence[Chunk]) -> dict[str, np.ndarray]:
    """The paged graph's per-pass inputs for ``chunks`` (see ovpool.worker.paged)."""
    lengths = np.array([len(c.tokens) for c in chunks], np.int32)
    starts = np.array([c.start for c in chunks], np.int32)
    ends = np.cumsum(lengths)
    positions = np.concatenate([np.arange(c.start, c.start + len(c.tokens)) for c in chunks])
    sampled = [end - 1 for c, end in zip(chunks, ends, strict=True) if c.sample]
    return {
        "input_ids": np.array([t for c in chunks for t in c.tokens], np.int64)[None, :],
        "position_ids": positions.astype(np.int64)[None, :],
        "past_lens": starts,
        "subsequence_begins": _offsets(lengths),
        "block_indices": np.array([b for c in chunks for b in c.blocks], np.int32),
        "block_indices_begins": _offsets([len(c.blocks) for c in chunks]),
        "max_context_len": np.array((starts + lengths).max(), np.int32),
        "logits_indices": np.array(sampled, np.int64),
    }


def _offsets(counts) -> np.ndarray:
    """[0, c0, c0+c1, ...]: where each sequence's run starts in a concatenation."""
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
