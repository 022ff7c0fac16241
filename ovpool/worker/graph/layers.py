"""Transformer building blocks as OpenVINO subgraphs, shaped the way the CPU plugin fuses them.

RMSNorm follows the Power → ReduceMean → Add → Sqrt → Divide → Multiply pattern (RMS fusion), RoPE
the rotate-half pattern (RoPE fusion), and the KV cache ReadValue → Gather(beam_idx) → Concat →
ScaledDotProductAttention with Assign (stateful SDPA fusion, KV-cache precision applies).
All activations are [batch, seq, ...] with both dimensions dynamic.
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset13 as ops
from openvino.op.util import Variable, VariableInfo

from ovpool.worker.gguf.model import HParams

_NEG = np.float32(np.finfo(np.float32).min)


def const(value, dtype=np.float32) -> ov.Node:
    return ops.constant(np.asarray(value, dtype))


def rms_norm(x: ov.Output, weight: np.ndarray, eps: float) -> ov.Output:
    var = ops.reduce_mean(ops.power(x, const([[[2.0]]])), const([-1], np.int64), True)
    inv = ops.divide(const([[[1.0]]]), ops.sqrt(ops.add(var, const([[[eps]]]))))
    return ops.multiply(ops.multiply(inv, x), const(weight.reshape(1, 1, -1))).output(0)


def rope_tables(position_ids: ov.Output, h: HParams, freq_factors: np.ndarray | None = None,
                heads_axis: int = 1, base: float | None = None):
    """cos and sin [batch, 1, seq, head_dim] (``heads_axis`` 2: [batch, seq, 1, head_dim]) for
    rotate-half RoPE. ``freq_factors`` (GGUF's rope_freqs.weight, Llama 3.1's long-context scaling)
    divide the frequencies, as in llama.cpp. ``base``: h.rope_base unless given."""
    half = h.rope_dim // 2
    base = h.rope_base if base is None else base
    inv_freq = 1.0 / (base ** (np.arange(half, dtype=np.float64) * 2 / h.rope_dim))
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors
    pos = ops.unsqueeze(ops.convert(position_ids, "f32"), const([-1], np.int64))
    freqs = ops.multiply(pos, const(inv_freq.reshape(1, 1, half)))
    emb = ops.unsqueeze(ops.concat([freqs, freqs], -1), const([heads_axis], np.int64))
    return ops.cos(emb).output(0), ops.sin(emb).output(0)


def apply_rope(x: ov.Output, cos: ov.Output, sin: ov.Output) -> ov.Output:
    # The halves as Slice ops: the CPU plugin's RoPE fusion matches Slice, not Split (a fused
    # RoPE node replaces ten per head group, a fifth of the decode step on SmolLM2).
    half = x.get_partial_shape()[-1].get_length() // 2
    first, second = (ops.slice(x, const([a], np.int64), const([b], np.int64), const([1], np.int64),
                               const([-1], np.int64)) for a, b in ((0, half), (half, half * 2)))
    rotated = ops.concat([ops.multiply(second, const(-1.0)), first], -1)
    return ops.add(ops.multiply(x, cos), ops.multiply(rotated, sin)).output(0)


def split_heads(x: ov.Output, heads: int, head_dim: int, heads_major: bool = True) -> ov.Output:
    """[batch, seq, heads*head_dim] → [batch, heads, seq, head_dim] (or, not ``heads_major``,
    [batch, seq, heads, head_dim])."""
    x = ops.reshape(x, const([0, 0, heads, head_dim], np.int64), True)
    if not heads_major:
        return x.output(0)
    return ops.transpose(x, const([0, 2, 1, 3], np.int64)).output(0)


def merge_heads(x: ov.Output, width: int) -> ov.Output:
    x = ops.transpose(x, const([0, 2, 1, 3], np.int64))
    return ops.reshape(x, const([0, 0, width], np.int64), True).output(0)


def attention_mask(mask: ov.Output, seq_of: ov.Output, window: int = 0) -> ov.Output:
    """Additive mask [batch, 1, seq, past+seq]: causal over cache positions, and padding.

    Query i sits at cache position past + i, so it sees keys j <= past + i whose mask bit is 1;
    with a sliding ``window``, only the last ``window`` of them (itself included: llama.cpp's
    LLAMA_SWA_TYPE_STANDARD masks keys with query - key >= window).
    """
    total = ops.gather(ops.shape_of(mask), const(1, np.int64), const(0, np.int64))
    seq = ops.gather(ops.shape_of(seq_of), const(1, np.int64), const(0, np.int64))
    keys = ops.range(const(0, np.int64), total, const(1, np.int64), "i64")
    queries = ops.range(ops.subtract(total, seq), total, const(1, np.int64), "i64")
    keys, queries = ops.unsqueeze(keys, const(0, np.int64)), ops.unsqueeze(queries, const(1, np.int64))
    causal = ops.less_equal(keys, queries)
    if window:
        causal = ops.logical_and(causal, ops.less(ops.subtract(queries, keys), const(window, np.int64)))
    padding = ops.unsqueeze(ops.not_equal(mask, const(0, np.int64)), const([1, 2], np.int64))
    allowed = ops.logical_and(ops.unsqueeze(causal, const([0, 1], np.int64)), padding)
    return ops.select(allowed, const(0.0), const(_NEG)).output(0)


def expand_kv(x: ov.Output, h: HParams) -> ov.Output:
    """GQA: repeat each KV head for its n_heads / n_kv_heads query heads."""
    group = h.n_heads // h.n_kv_heads
    if group == 1:
        return x
    x = ops.unsqueeze(x, const(2, np.int64))
    x = ops.broadcast(x, const([1, 1, group, 1, 1], np.int64), broadcast_spec="BIDIRECTIONAL")
    return ops.reshape(x, const([0, h.n_heads, -1, h.head_dim], np.int64), True).output(0)


def attend(q, k, v, mask, h: HParams, manual: bool) -> ov.Output:
    scale = const(h.scale)
    k, v = expand_kv(k, h), expand_kv(v, h)
    if not manual:
        return ops.scaled_dot_product_attention(q, k, v, mask, scale, causal=False).output(0)
    scores = ops.add(ops.multiply(ops.matmul(q, k, False, True), scale), mask)
    return ops.matmul(ops.softmax(scores, -1), v, False, False).output(0)


def kv_state(name: str, batch_of: ov.Output, beam_idx: ov.Output, h: HParams):
    """A KV-cache variable: (past [batch, kv_heads, past, head_dim], the Variable)."""
    info = VariableInfo()
    info.variable_id = name
    info.data_type = ov.Type.f32
    info.data_shape = ov.PartialShape([-1, h.n_kv_heads, -1, h.head_dim])
    var = Variable(info)
    batch = ops.gather(ops.shape_of(batch_of), const([0], np.int64), const(0, np.int64))
    empty_shape = ops.concat([batch, const([h.n_kv_heads, 0, h.head_dim], np.int64)], 0)
    init = ops.broadcast(const(0.0), empty_shape)
    past = ops.gather(ops.read_value(init, var), beam_idx, const(0, np.int64))
    return past.output(0), var


def swiglu(gate: ov.Output, up: ov.Output) -> ov.Output:
    return ops.multiply(ops.swish(gate), up).output(0)


def gelu_tanh_gated(gate: ov.Output, up: ov.Output) -> ov.Output:
    """gemma3's MLP gate: GELU with the tanh approximation (ggml_gelu), times up."""
    return ops.multiply(ops.gelu(gate, "tanh"), up).output(0)
