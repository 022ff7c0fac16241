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
        n_heads = q.get_partial_shape()[-2].get_length()
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
        node = _paged_op([a.output(0) if isinstance(a, ov.Node) else a for a in args])
        size = head_dim.get_length()
        out = ops.unsqueeze(node.output(0), _scalar([0], np.int64))
        return ops.reshape(out, _scalar([1, -1, n_heads * size], np.int64), False).output(0)

    def select(self, params: dict, x: ov.Output) -> ov.Output:
        """Rows ``logits_indices`` of x [1, T, embd] → [1, n, embd]."""
        return ops.gather(x, params["logits_indices"], _scalar(1, np.int64)).output(0)


def read_ir(xml: bytes, weights: ov.Tensor) -> ov.Model:
    """A paged graph from its IR (ovpool.cache.ir). The op is OpenVINO's internal extension, which
    ``read_model`` cannot create, and the IR drops its node rt_info (only registered attributes
    and ``user_data`` keys survive a serialization), so the XML's ops are read as placeholders and
    replaced by real ones with their head sizes set again."""
    core = ov.Core()  # a reader of its own: the placeholder extension stays out of the engine's core
    core.add_extension(ov.OpExtension(_Placeholder))
    model = core.read_model(xml.decode(), weights)
    for node in model.get_ordered_ops():
        if isinstance(node, _Placeholder):
            real = _paged_op(list(node.input_values()))
            for i in range(node.get_output_size()):
                node.output(i).replace(real.output(i))
    model.validate_nodes_and_infer_types()
    return model


def _paged_op(args: list[ov.Output]) -> ov.Node:
    """The op on ``args`` (q, k and v flattened by ``_flat``, the caches, the per-pass inputs...),
    with the rt_info the CPU plugin sizes its kernels from (and refuses to run without)."""
    node = ov_op._PagedAttentionExtension(args)
    kv_heads, size = _heads(args[1])
    rt = node.get_rt_info()
    for key, value in (("num_k_heads", kv_heads), ("k_head_size", size),
                       ("num_v_heads", kv_heads), ("v_head_size", size)):
        rt[key] = value
    return node


def _heads(flat_k: ov.Output) -> tuple[int, int]:
    """(kv heads, head size) of k as ``_flat`` made it: from the shape before its reshape."""
    heads, dim = (flat_k.get_node().input_value(0).get_partial_shape()[i].get_length() for i in (2, 3))
    return heads, dim


class _Placeholder(ov.Op):
    """Stands for the op while ``read_ir`` reads the XML; outputs as the op's: [T, heads*dim]
    and two score vectors."""

    class_type_info = ov.DiscreteTypeInfo("PagedAttentionExtension", "extension")

    def __init__(self, inputs=None):
        super().__init__(self, inputs) if inputs is not None else super().__init__(self)

    def validate_and_infer_types(self) -> None:
        self.set_output_type(0, self.get_input_element_type(0), self.get_input_partial_shape(0))
        for i in (1, 2):
            self.set_output_type(i, ov.Type.f32, ov.PartialShape([-1]))

    def clone_with_new_inputs(self, new_inputs):
        return _Placeholder(new_inputs)

    def get_type_info(self):
        return _Placeholder.class_type_info

    def visit_attributes(self, visitor) -> bool:
        return True


def _flat(x: ov.Output) -> ov.Output:
    """[1, T, heads, head_dim] → [T, heads*head_dim] (the op's layout)."""
    heads, dim = (x.get_partial_shape()[i].get_length() for i in (2, 3))
    return ops.reshape(x, _scalar([-1, heads * dim], np.int64), False).output(0)
