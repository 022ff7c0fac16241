"""Packed GGUF weights (ovpool.worker.gguf.quants) as OpenVINO compressed constants.

Each weight becomes the decompression pattern the CPU plugin fuses into its kernels:
``Constant(u4/i4/i8) → Convert → [Subtract zero point] → Multiply scale → Reshape → MatMul``
(or ``→ Gather`` for the embedding table: the plugin gathers the compressed rows, then decompresses
only those). Constants hold their own copy of the compressed bytes (see ``constant``); the CPU
plugin repacks them at compile time anyway, and the memmap's pages stay clean page cache.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import openvino as ov
import openvino.opset13 as ops
from gguf import GGMLQuantizationType as T

from ovpool.worker.gguf.blocks import unpack
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.gguf.quants import (
    Packed,
    centered,
    concat_rows,
    float_activations,
    float_zero,
    gatherable,
    group_sums,
    integer_zero,
    permute_rows,
    requantize,
    rounded_zero,
    widen,
    zero_row,
)
from ovpool.worker.graph.arena import ConstantArena

_ELEMENT = {"f32": ov.Type.f32, "f16": ov.Type.f16, "bf16": ov.Type.bf16, "i8": ov.Type.i8,
            "u8": ov.Type.u8, "u4": ov.Type.u4, "i4": ov.Type.i4, "u2": ov.Type.u2}


def constant(array: np.ndarray, element: ov.Type | None = None, shape=None,
             arena: ConstantArena | None = None) -> ov.Node:
    """A Constant holding a copy of ``array`` in ``arena`` (ovpool.worker.graph.arena: pages the
    process hands back once the plugin has repacked them), else in OpenVINO-owned memory.

    A Constant over numpy memory does not keep the array alive (a crash at compile time once the
    array is collected), so the bytes are copied once into an ov.Tensor the Constant shares.
    """
    array = np.ascontiguousarray(array)
    if element is None:
        element, shape = ov.Type(array.dtype), array.shape
    tensor = arena.tensor(element, shape) if arena is not None else None
    if tensor is None:
        tensor = ov.Tensor(element, ov.Shape(list(shape)))
    tensor.data.reshape(-1)[:] = array.reshape(-1).view(tensor.data.dtype)
    return ops.constant(tensor, shared_memory=True)


# The weight types each ``kquant_requant`` choice re-encodes (ovpool.worker.gguf.quants.requantize;
# ``q6_k_q8_sym32``: Q6_K alone, in q8_sym32, Q4_K kept as it is).
REQUANTIZED = {"q4_asym32": (T.Q4_K, T.Q6_K), "q8_sym32": (T.Q4_K, T.Q6_K), "q6_k_q8_sym32": (T.Q6_K,)}


@dataclass(frozen=True)
class Encoding:
    """How GGUF blocks become constants: the graph settings ``kquant_requant``, ``q4_storage`` and
    ``zero_points`` (``auto`` here means i4 and float; the engine passes resolved settings)."""

    requant: str = "none"
    q4_storage: str = "i4"
    zero_points: str = "float"
    one_layout: bool = False  # a spare row where the CPU plugin would lay a weight out twice
    float_head: bool = False  # the output projection without int8 activations (see ``head``)
    float_codes: bool = False  # this weight in quants.float_activations' form

    @classmethod
    def of(cls, settings) -> Encoding:
        f32 = settings.inference_precision == "f32"
        return cls(settings.kquant_requant, settings.q4_storage, settings.zero_points, f32,
                   float_head=f32 and settings.activations == "int8")

    def head(self) -> Encoding:
        """The output projection's encoding: at f32 with int8 activations one the plugin's int8
        path does not take, because the head's near-ties decide the token (int8 there lowered
        the top-1 agreement with the exact graph: docs/performance.md, Quality)."""
        return replace(self, zero_points="float", float_codes=True) if self.float_head else self


def load(model: GGUFModel, name: str, head_size: int = 0, encoding: Encoding = Encoding(),
         arena: ConstantArena | None = None) -> Weight:
    """Tensor ``name`` as a Weight; ``head_size`` > 0 un-permutes llama's Q/K rows (see below);
    its constants go into ``arena`` (see ``constant``)."""
    packed = _packed(model, name, head_size, encoding)
    model.release(name)
    return Weight(packed, name, arena, encoding.one_layout)


def load_stacked(model: GGUFModel, names: list[str], head_sizes: list[int],
                 encoding: Encoding = Encoding(), arena: ConstantArena | None = None) -> Weight | None:
    """Tensors sharing an input (Q, K, V; gate, up) as one Weight with their rows stacked, so one
    MatMul kernel runs where there were several; None if their encodings differ."""
    parts = [_packed(model, n, hs, encoding) for n, hs in zip(names, head_sizes, strict=True)]
    for name in names:
        model.release(name)
    packed = concat_rows(parts)
    return None if packed is None else Weight(packed, "+".join(names), arena, encoding.one_layout)


def _packed(model: GGUFModel, name: str, head_size: int, encoding: Encoding) -> Packed:
    info = model.tensors[name]
    packed = unpack(info.ggml_type, model.raw(name), info.shape)
    # float, integer, rounded start from the float zero point
    packed = centered(packed) if encoding.zero_points == "offset" else float_zero(packed)
    if info.ggml_type in REQUANTIZED.get(encoding.requant, ()):
        packed = requantize(packed, encoding.requant.removeprefix("q6_k_"))
    if head_size:
        packed = permute_rows(packed, rope_halves_order(packed.shape[0], head_size))
    if encoding.float_codes:
        packed = float_activations(packed)
    elif encoding.zero_points == "integer":
        packed = integer_zero(packed)
    elif encoding.zero_points == "rounded":
        packed = rounded_zero(packed)
    return widen(packed) if encoding.q4_storage == "i8" else packed


def int8_groups(model: GGUFModel, encoding: Encoding = Encoding()) -> set[int]:
    """The group sizes of ``model``'s integer-coded weights, from the tensor types alone (no weight
    is read): 16 for Q6_K, Q3_K and Q2_K (Q4_K and Q6_K: unless requantized to 32-weight groups),
    32 for the other block types (ovpool.worker.gguf.blocks)."""
    types = {info.ggml_type for info in model.tensors.values()} - {T.F32, T.F16, T.BF16}
    if T.Q6_K in REQUANTIZED.get(encoding.requant, ()):
        types = {T.Q8_0 if t == T.Q6_K else t for t in types}
    return {16 if t in (T.Q6_K, T.Q3_K, T.Q2_K) else 32 for t in types}


def rope_halves_order(rows: int, head_size: int) -> np.ndarray:
    """Row order that turns GGUF's interleaved-pair Q/K rows back into rotate-half order.

    llama.cpp's converter permutes each head's rows so that RoPE rotates adjacent pairs
    (2i, 2i+1); HF's rotate_half pairs i with i + head_size/2. Row i + j*head_size/2 of the
    rotate-half layout is row 2i + j of the GGUF layout. Permuting whole quantized rows is exact.
    """
    half = head_size // 2
    i, j = np.meshgrid(np.arange(half), np.arange(2))
    within = (2 * i + j).reshape(-1)
    heads = np.arange(rows // head_size)[:, None] * head_size
    return (heads + within[None, :]).reshape(-1)


class Weight:
    """One [rows, cols] weight as OpenVINO nodes; the f32 matrix is never materialised."""

    def __init__(self, packed: Packed, name: str, arena: ConstantArena | None = None,
                 one_layout: bool = False):
        self.packed, self.name, self.arena, self.one_layout = packed, name, arena, one_layout
        self.rows, self.cols = packed.shape
        self._matrix: ov.Output | None = None
        self._table: Weight | None = None
        self._sums: Weight | None = None
        self._offset: ov.Output | None = None
        self._spared: Weight | None = None
        self._looked_up = False

    def matrix(self) -> ov.Output:
        """The decompressed [rows, cols] f32 weight (a subgraph the plugin fuses, built once)."""
        if self._matrix is None:
            self._matrix = self._decompress()
        return self._matrix

    def _decompress(self) -> ov.Output:
        p = self.packed
        if p.group == 0:
            node = constant(p.codes, _ELEMENT[p.element], p.shape, self.arena) \
                if p.element == "bf16" else constant(p.codes, arena=self.arena)
            node.set_friendly_name(self.name)
            return node.output(0) if p.element == "f32" else ops.convert(node, "f32").output(0)
        groups = self.cols // p.group
        codes = constant(p.codes, _ELEMENT[p.element], (self.rows, groups, p.group), self.arena)
        codes.set_friendly_name(self.name)
        # f32 arithmetic: a float zero point (exact Q4_1/Q4_K minimum) needs it (f16 would round
        # it), and the CPU plugin computes with f32 scales anyway: handed f16 ones it keeps a
        # converted copy per compiled model (docs/performance.md, weights.py).
        x = ops.convert(codes, "f32")
        if p.zero is not None and p.zero.dtype != np.uint8:
            x = ops.subtract(x, constant(p.zero[..., None], arena=self.arena))
        elif p.zero is not None and p.zero.max() < 16:
            zero = constant(_pack_zero(p.zero), ov.Type.u4, (self.rows, groups, 1), self.arena)
            x = ops.subtract(x, ops.convert(zero, "f32"))
        elif p.zero is not None:
            zero = constant(p.zero[..., None], arena=self.arena)
            x = ops.subtract(x, ops.convert(zero, "f32"))
        x = ops.multiply(x, constant(p.scale[..., None].astype(np.float32), arena=self.arena))
        return ops.reshape(x, ops.constant(np.array([self.rows, self.cols], np.int64)), False).output(0)

    def linear(self, x: ov.Output, sizes: list[int] | None = None) -> list[ov.Output]:
        """x [..., cols] @ W.T, cut along its last axis into pieces of ``sizes`` (default: one of
        ``rows``)."""
        sizes = sizes or [self.rows]
        if self.packed.offset is None or self.packed.zero is None:
            spare = self._spare_row(self.rows)
            w = self._with_spare() if spare else self
            y = ops.matmul(x, w.matrix(), False, True)
            if w.packed.offset is not None:
                # zero_points=offset (scale * c + offset): codes with no zero point, one Subtract
                # per weight less than a float zero point, and the offsets' share from x's group
                # sums (docs/performance.md, "Cost against model size").
                sums = ops.reduce_sum(self._grouped(x), ops.constant(np.int64(-1)), False)
                y = ops.add(y, ops.matmul(sums, w._offsets(), False, True))
            return _cut(y, sizes + [1] * spare)[:len(sizes)]
        # The offsets' share: each group's offset times the sum of x over the group's columns. The
        # sums come out of the main MatMul, as rows of ones under the weight (quants.group_sums):
        # one ReduceSum node less per weight, faster at the same agreement (docs/performance.md,
        # weights.py). The int8 path quantizes x for those rows as for the others, an error far
        # below the offset's own share.
        summing = self._summing()
        parts = [self.rows, self.cols // self.packed.group, summing.rows - self._summed_rows()]
        both = ops.matmul(x, summing.matrix(), False, True)
        y, sums = _cut(both, [p for p in parts if p])[:2]
        return _cut(ops.add(y, ops.matmul(sums, self._offsets(), False, True)), sizes)

    def _spare_row(self, rows: int) -> int:
        """1 where a MatMul of ``rows`` rows of this weight gets a zero row more, else 0.

        At f32 the CPU plugin (oneDNN's brgemm inner product) lays a compressed weight of fewer
        than 4 M elements whose rows are a multiple of 32 out twice: in blocks of 32 rows for
        passes of 7-80 rows, of 64 for the others. A row count that is not such a multiple gets
        one layout, its last block padded to 64 rows, every output bit as before: one copy of
        the weights in memory instead of two. Each padded row is read at every pass, so only
        where the padding adds at most 1/50 of the rows (a spare row in every weight costs decode
        CPU: docs/performance.md, "gemma3-270m against llama.cpp"). A
        looked-up table keeps its rows: its Gather and its MatMul share one constant."""
        padding = _in_blocks(rows + 1) - _in_blocks(rows)
        return int(self.one_layout and self.packed.group > 0 and not self._looked_up
                   and rows % 32 == 0 and rows * self.cols < 4 << 20 and padding * 50 <= rows)

    def _with_spare(self) -> Weight:
        """This weight with a zero row under it (see ``_spare_row``), made once."""
        if self._spared is None:
            self._spared = Weight(concat_rows([self.packed, zero_row(self.packed)]), self.name, self.arena)
        return self._spared

    def _summed_rows(self) -> int:
        return self.rows + self.cols // self.packed.group

    def _summing(self) -> Weight:
        """This weight with the group-sum rows under it (see ``linear``) and a spare zero row
        where ``_spare_row`` wants one, made once."""
        if self._sums is None:
            parts = [self.packed, group_sums(self.packed)]
            if self._spare_row(self._summed_rows()):
                parts.append(zero_row(parts[1]))
            self._sums = Weight(concat_rows(parts), self.name, self.arena)
        return self._sums

    def _offsets(self) -> ov.Output:
        """The [rows, groups] offsets as a constant, made once."""
        if self._offset is None:
            self._offset = constant(self.packed.offset, arena=self.arena).output(0)
        return self._offset

    def lookup(self, ids: ov.Output) -> ov.Output:
        """Rows ``ids`` [...] → [..., cols] (the embedding table's lookup)."""
        self._looked_up = True
        table = self._gather_table()
        table._looked_up = True
        axis = ops.constant(np.int64(0))
        if table.packed.offset is None:
            return ops.gather(table.matrix(), ids, axis).output(0)
        # The rows and offsets ``linear`` reads (the group-sum rows under them are never looked
        # up), so that a tied vocabulary has one copy of its codes and offsets in the graph.
        main = table if table.packed.zero is None else table._summing()
        rows = ops.gather(main.matrix(), ids, axis).output(0)
        offsets = ops.gather(table._offsets(), ids, axis)
        offsets = ops.unsqueeze(offsets, ops.constant(np.int64(-1)))
        whole = ops.concat([ops.shape_of(ids), ops.constant(np.array([self.cols], np.int64))], 0)
        return ops.reshape(ops.add(table._grouped(rows), offsets), whole, False).output(0)

    def _gather_table(self) -> Weight:
        """This weight, or a copy in a form the CPU plugin gathers compressed (quants.gatherable):
        only a tied Q2_K vocabulary keeps both (llama.cpp writes a tied one as Q6_K)."""
        if self._table is None and (table := gatherable(self.packed)) is not self.packed:
            self._table = Weight(table, self.name, self.arena)
        # Never ``self._table = self``: that cycle kept the table's unpacked codes alive until a
        # garbage collection (a whole vocabulary's codes, held through the warm-up).
        return self._table or self

    def _grouped(self, x: ov.Output) -> ov.Output:
        """x [..., cols] as [..., groups, group]."""
        rank = x.get_partial_shape().rank.get_length()
        lead = ops.gather(ops.shape_of(x), ops.constant(np.arange(rank - 1)), ops.constant(np.int64(0)))
        dims = ops.constant(np.array([self.cols // self.packed.group, self.packed.group], np.int64))
        return ops.reshape(x, ops.concat([lead, dims], 0), False).output(0)


def _in_blocks(rows: int) -> int:
    """``rows`` rounded up to the plugin's 64-row blocks."""
    return -(-rows // 64) * 64


def _cut(y: ov.Node, sizes: list[int]) -> list[ov.Output]:
    """y's last axis in pieces of ``sizes`` (one piece: y itself, no node)."""
    if len(sizes) == 1:
        return [y.output(0)]
    axis = ops.constant(np.int64(-1))
    return ops.variadic_split(y, axis, ops.constant(np.array(sizes, np.int64))).outputs()


def _pack_zero(zero: np.ndarray) -> np.ndarray:
    flat = zero.reshape(-1)
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return flat[0::2] | (flat[1::2] << np.uint8(4))
