"""The paged-attention variant of the graph: every running sequence in one forward pass.

OpenVINO's ``PagedAttentionExtension`` op (the one GenAI's ContinuousBatchingPipeline runs) reads
and writes the KV cache in blocks of ``block_size`` positions held in per-layer input tensors
``key_cache.{i}`` / ``value_cache.{i}`` that the plugin updates in place. A forward pass takes the
new tokens of all scheduled sequences concatenated (``input_ids``/``position_ids`` [1, T]) with,
per sequence: ``past_lens`` (positions already cached), ``subsequence_begins`` (offsets into the
T tokens, B+1 entries), its block table (``block_indices``, delimited by ``block_indices_begins``)
and ``max_context_len``. ``logits_indices`` picks the rows that get the vocabulary projection.

The cache tensors' element type and block layout are the plugin's choice (KV_CACHE_PRECISION:
u8 keeps per-block scales inside the blocks), read back from the compiled model's inputs.
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset13 as ops
from openvino import op as ov_op

from ovpool.worker.gguf.model import HParams

# The op's 28 inputs (OpenVINO 2026.4): q, k, v, the two caches, the four per-pass tensors, then
# scale, sliding window, alibi slopes, max_context_len, and optional features all disabled here
# (score aggregation, cache rotation, xattention, sinks, adaptive R-KV, token types, qq bias).
_PER_PASS = ("past_lens", "subsequence_begins", "block_indices", "block_indices_begins")


def _empty(dtype) -> ov.Node:
    return ops.constant(np.zeros(0, dtype))


def _scalar(value, dtype) -> ov.Node:
    return ops.constant(np.array(value, dtype))


class PagedAttention:
    """The ``attention`` hook of ``ovpool.worker.graph.builder`` (see ``graph.port_spec``)."""

    def ports(self, h: HParams) -> list[dict]:
        rows = [(name, "i32", "[?]") for name in _PER_PASS]
        rows += [("max_context_len", "i32", "[]"), ("logits_indices", "i64", "[?]")]
        rows += [(f"{kind}_cache.{i}", "dynamic", "[?,?,?,?]")
                 for i in range(h.n_layers) for kind in ("key", "value")]
        return [{"name": n, "direction": "in", "element_type": t, "partial_shape": p} for n, t, p in rows]

    def attend(self, params: dict, layer: int, q, k, v, scale: float, window: int = 0) -> ov.Output:
        """q [1, T, heads, head_dim], k/v [1, T, kv_heads, head_dim] → [1, T, heads*head_dim];
        ``scale`` multiplies q·k, ``window`` > 0: each query sees that many latest keys."""
        head_dim = q.get_partial_shape()[-1]
        n_heads, kv_heads = (x.get_partial_shape()[-2].get_length() for x in (q, k))
        args = [_flat(q), _flat(k), _flat(v),
                params[f"key_cache.{layer}"], params[f"value_cache.{layer}"],
                *(params[name] for name in _PER_PASS),
                _scalar(scale, np.float32), _scalar(window, np.int32),
                _empty(np.float32), params["max_context_len"],
                _empty(np.int32), _empty(np.int32), _empty(np.int32), _empty(np.float32),
                _empty(np.float32), _scalar(0, np.int32), _scalar(0, np.int32),
                ops.constant(np.zeros((0, 0, 0, 0), np.float32)),
                _scalar(0, np.int32), _empty(np.int32), _empty(np.int32), _empty(np.int32),
                _empty(np.int32), _empty(np.uint8), _empty(np.int32)]
        node = ov_op._PagedAttentionExtension([a.output(0) if isinstance(a, ov.Node) else a for a in args])
        rt = node.get_rt_info()  # the CPU plugin sizes its kernels from these
        size = head_dim.get_length()
        for key, value in (("num_k_heads", kv_heads), ("k_head_size", size),
                           ("num_v_heads", kv_heads), ("v_head_size", size)):
            rt[key] = value
        out = ops.unsqueeze(node.output(0), _scalar([0], np.int64))
        return ops.reshape(out, _scalar([1, -1, n_heads * size], np.int64), False).output(0)

    def select(self, params: dict, x: ov.Output) -> ov.Output:
        """Rows ``logits_indices`` of x [1, T, embd] → [1, n, embd]."""
        return ops.gather(x, params["logits_indices"], _scalar(1, np.int64)).output(0)


def _flat(x: ov.Output) -> ov.Output:
    """[1, T, heads, head_dim] → [T, heads*head_dim] (the op's layout)."""
    heads, dim = (x.get_partial_shape()[i].get_length() for i in (2, 3))
    return ops.reshape(x, _scalar([-1, heads * dim], np.int64), False).output(0)
