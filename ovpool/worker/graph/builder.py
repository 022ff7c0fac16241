"""The dynamic OpenVINO graph of a GGUF model: llama, qwen2, qwen3, gemma3, phi3 (contract 1 of the
shared contracts).

One graph, with dynamic batch and sequence dimensions, serves prefill and decode. Ports:
``input_ids``, ``attention_mask``, ``position_ids`` (i64), ``beam_idx`` (i32, stateful only),
``logits_from`` (i64 [1]: logits only for positions >= it, so prefill skips the vocabulary
projection of every prompt token but the last) → ``logits`` f32 [batch, seq - logits_from, vocab].
The KV cache lives in variables ``past_key_values.{layer}.key/value`` or, with ``stateful=off``,
in explicit ``past_key_values.*`` inputs and ``present.*`` outputs, [batch, kv_heads, past, head_dim].
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from ovpool.config import GraphConfig
from ovpool.errors import UnsupportedModelError
from ovpool.worker.gguf.blocks import unpack
from ovpool.worker.gguf.model import ROPE_FREQS, GGUFModel, HParams
from ovpool.worker.gguf.quants import dequantize
from ovpool.worker.graph import layers as L
from ovpool.worker.graph import weights as W
from ovpool.worker.graph.arena import ConstantArena


def builder_sources(worker: Path = Path(__file__).parent.parent) -> list[Path]:
    """Every module that shapes a graph: all of worker/graph/ (builder, layers, weights, paged,
    decode, loading) and worker/gguf/ (hparams, quant decoding). Derived from the folders, not
    listed by hand, so a new module can't be left out; over-covering only costs a recompile."""
    return sorted([*(worker / "graph").glob("*.py"), *(worker / "gguf").glob("*.py")])


def source_hash(sources: list[Path]) -> str:
    """sha256 over each module's folder, name, size and bytes (moving code between modules counts)."""
    digest = hashlib.sha256()
    for path in sources:
        data = path.read_bytes()
        digest.update(f"{path.parent.name}/{path.name} {len(data)}\n".encode())
        digest.update(data)
    return digest.hexdigest()


BUILDER_HASH = source_hash(builder_sources())

_MAX = np.iinfo(np.int64).max
_TYPES = {"i64": ov.Type.i64, "i32": ov.Type.i32, "f32": ov.Type.f32, "dynamic": ov.Type.dynamic}


def _kv_names(h: HParams) -> list[str]:
    return [f"{i}.{kind}" for i in range(h.n_layers) for kind in ("key", "value")]


def port_spec(hparams: HParams, graph: GraphConfig | Mapping[str, Any], attention=None) -> list[dict]:
    """The graph's ports, computed from hparams and the graph settings alone (no weights, no build).

    ``attention`` (e.g. ovpool.worker.graph.paged.PagedAttention) replaces the KV cache, the attention
    mask and ``logits_from`` with its own inputs: ``ports(hparams)`` lists them,
    ``attend(params, layer, q, k, v, scale, window)`` takes q/k/v [batch, seq, heads, head_dim]
    after RoPE (no transposes), the softmax scale and the layer's sliding window (0: none), and
    returns [batch, seq, heads*head_dim], ``select(params, x)`` picks the rows
    that get logits.
    """
    s = GraphConfig.coerce(graph)
    if attention is not None:
        return [{"name": "input_ids", "direction": "in", "element_type": "i64", "partial_shape": "[?,?]"},
                {"name": "position_ids", "direction": "in", "element_type": "i64", "partial_shape": "[?,?]"},
                *attention.ports(hparams),
                {"name": "logits", "direction": "out", "element_type": "f32",
                 "partial_shape": f"[?,?,{hparams.vocab_size}]"}]
    kv_shape = f"[?,{hparams.n_kv_heads},?,{hparams.head_dim}]"
    ins = [("input_ids", "i64", "[?,?]"), ("attention_mask", "i64", "[?,?]"),
           ("position_ids", "i64", "[?,?]")]
    if s.stateful:
        ins.append(("beam_idx", "i32", "[?]"))
    ins.append(("logits_from", "i64", "[1]"))
    outs = [("logits", "f32", f"[?,?,{hparams.vocab_size}]")]
    if not s.stateful:
        ins += [(f"past_key_values.{n}", "f32", kv_shape) for n in _kv_names(hparams)]
        outs += [(f"present.{n}", "f32", kv_shape) for n in _kv_names(hparams)]
    return [{"name": n, "direction": d, "element_type": t, "partial_shape": p}
            for d, group in (("in", ins), ("out", outs)) for n, t, p in group]


def model_ports(model: ov.Model) -> list[dict]:
    """The same description as port_spec, read from a built (or compiled) model."""
    def row(port, direction):
        return {"name": port.get_any_name(), "direction": direction,
                "element_type": port.get_element_type().get_type_name(),
                "partial_shape": str(port.get_partial_shape()).replace(" ", "")}
    return [row(p, "in") for p in model.inputs] + [row(p, "out") for p in model.outputs]


@dataclass
class _Context:
    model: GGUFModel
    settings: GraphConfig
    params: dict[str, ov.Node]
    rope: dict[float, tuple[ov.Output, ov.Output]]  # RoPE base -> (cos, sin)
    masks: dict[int, ov.Output]  # sliding window (0: none) -> additive mask; SDPA only
    sinks: list
    results: list
    attention: object = None
    arena: ConstantArena | None = None

    @property
    def h(self) -> HParams:
        return self.model.hparams

    @property
    def encoding(self) -> W.Encoding:
        return W.Encoding.of(self.settings)


def build_model(model: GGUFModel, graph: GraphConfig | Mapping[str, Any], attention=None,
                arena: ConstantArena | None = None) -> ov.Model:
    """The model's OpenVINO graph (reads the weights into compressed constants, in ``arena`` if
    given: ovpool.worker.graph.arena).

    ``attention``: see port_spec."""
    s = GraphConfig.coerce(graph)
    h = model.hparams
    if h.rope_dim != h.head_dim:
        raise UnsupportedModelError(f"partial RoPE ({h.rope_dim} of {h.head_dim} dims) is not supported")
    params = {p["name"]: _parameter(p) for p in port_spec(h, s, attention) if p["direction"] == "in"}
    encoding = W.Encoding.of(s)
    embed = W.load(model, "token_embd.weight", arena=arena,
                   encoding=encoding.head() if h.tied_embeddings else encoding)
    x = embed.lookup(params["input_ids"].output(0))
    if h.embed_scale != 1.0:  # gemma3: by sqrt(n_embd), in f32 as llama.cpp does
        x = ops.multiply(x, L.const(h.embed_scale)).output(0)
    ctx = _Context(model, s, params, _rope(model, params, attention), _masks(h, params, attention),
                   [], [], attention, arena)
    for i in range(h.n_layers):
        x = _block(ctx, i, x)
    x = _norm(ctx, x, "output_norm")
    head = embed if h.tied_embeddings else W.load(model, "output.weight", encoding=encoding.head(),
                                                  arena=arena)
    logits = ops.result(head.linear(x)[0])
    logits.output(0).get_tensor().set_names({"logits"})
    return ov.Model([logits, *ctx.results], ctx.sinks, list(params.values()), model.name)


def _rope(model: GGUFModel, params: dict, attention) -> dict[float, tuple[ov.Output, ov.Output]]:
    """cos/sin tables for each RoPE base the layers use (gemma3's local layers have their own)."""
    h = model.hparams
    factors = _vector(model, ROPE_FREQS) if ROPE_FREQS in model.tensors else None
    # The paged op takes tokens-major q/k/v: RoPE works in that layout, so no transposes.
    heads_axis = 1 if attention is None else 2
    bases = {_layer_base(h, i) for i in range(h.n_layers)}
    return {base: L.rope_tables(params["position_ids"].output(0), h, factors, heads_axis, base)
            for base in sorted(bases)}


def _layer_base(h: HParams, layer: int) -> float:
    return h.rope_base_local if h.local(layer) else h.rope_base


def _layer_window(h: HParams, layer: int) -> int:
    return h.sliding_window if h.local(layer) else 0


def _masks(h: HParams, params: dict, attention) -> dict[int, ov.Output]:
    if attention is not None:  # the paged op masks by itself
        return {}
    windows = {_layer_window(h, i) for i in range(h.n_layers)}
    return {w: L.attention_mask(params["attention_mask"].output(0), params["input_ids"].output(0), w)
            for w in sorted(windows)}


def const_i64(values) -> ov.Node:
    return ops.constant(np.asarray(values, np.int64))


def _parameter(port: dict) -> ov.Node:
    p = ops.parameter(ov.PartialShape(port["partial_shape"]), _TYPES[port["element_type"]],
                      name=port["name"])
    p.output(0).get_tensor().set_names({port["name"]})
    return p


def _vector(model: GGUFModel, name: str) -> np.ndarray:
    info = model.tensors[name]
    return dequantize(unpack(info.ggml_type, model.raw(name), info.shape)).reshape(-1)


def _projections(ctx: _Context, names: list[str], x: ov.Output, heads: list[int]) -> list[ov.Output]:
    """x @ W.T (+ bias) for each of ``names`` (sharing input x), as one stacked MatMul when the
    weights are encoded alike. ``heads`` > 0 marks llama Q/K rows to un-permute for RoPE."""
    llama = ctx.model.architecture == "llama"
    permutes = [ctx.h.head_dim if n and llama else 0 for n in heads]
    stacked = W.load_stacked(ctx.model, [n + ".weight" for n in names], permutes, ctx.encoding,
                             ctx.arena)
    if stacked is None:
        outs = [W.load(ctx.model, n + ".weight", p, ctx.encoding, ctx.arena).linear(x)[0]
                for n, p in zip(names, permutes, strict=True)]
    else:
        outs = stacked.linear(x, [ctx.model.tensors[n + ".weight"].shape[0] for n in names])
    return [_bias(ctx, n, y, p) for n, y, p in zip(names, outs, permutes, strict=True)]


def _split(y: ov.Output, sizes: list[int]) -> list[ov.Output]:
    """y's last axis cut into pieces of ``sizes``."""
    return ops.variadic_split(y, const_i64(-1), const_i64(sizes)).outputs()


def _bias(ctx: _Context, name: str, y: ov.Output, permute: int) -> ov.Output:
    if name + ".bias" not in ctx.model.tensors:
        return y
    bias = _vector(ctx.model, name + ".bias")
    if permute:
        bias = bias[W.rope_halves_order(bias.size, permute)]
    return ops.add(y, L.const(bias)).output(0)


def _block(ctx: _Context, i: int, x: ov.Output) -> ov.Output:
    h, b = ctx.h, f"blk.{i}."
    a = _attention(ctx, i, _norm(ctx, x, b + "attn_norm"))
    if i == h.n_layers - 1:
        # Past the last attention only the positions that get logits matter (the KV cache is
        # written): the last layer's output projection and MLP run on those rows alone.
        a, x = _rows_for_logits(ctx, a), _rows_for_logits(ctx, x)
    (o,) = _projections(ctx, [b + "attn_output"], a, [0])
    x = ops.add(x, _post_norm(ctx, o, b + "post_attention_norm")).output(0)
    n = _norm(ctx, x, b + "ffn_norm")
    if h.fused_gate_up:  # phi3: gate rows, then up rows, in one matrix
        gate, up = _split(*_projections(ctx, [b + "ffn_up"], n, [0]), [h.n_ff, h.n_ff])
    else:
        gate, up = _projections(ctx, [b + "ffn_gate", b + "ffn_up"], n, [0, 0])
    act = L.gelu_tanh_gated(gate, up) if h.activation == "gelu_tanh" else L.swiglu(gate, up)
    (down,) = _projections(ctx, [b + "ffn_down"], act, [0])
    return ops.add(x, _post_norm(ctx, down, b + "post_ffw_norm")).output(0)


def _attention(ctx: _Context, i: int, n: ov.Output) -> ov.Output:
    """Self-attention of layer i on the normed input n: [batch, seq, heads*head_dim]."""
    h, b = ctx.h, f"blk.{i}."
    if h.fused_qkv:  # phi3 (rotate-half rows already, like every architecture but llama)
        q, k, v = _split(*_projections(ctx, [b + "attn_qkv"], n, [0]),
                         [h.n_heads * h.head_dim, *[h.n_kv_heads * h.head_dim] * 2])
    else:
        q, k, v = _projections(ctx, [b + "attn_q", b + "attn_k", b + "attn_v"], n,
                               [h.n_heads, h.n_kv_heads, 0])
    major = ctx.attention is None  # SDPA wants [batch, heads, seq, head_dim]
    cos, sin = ctx.rope[_layer_base(h, i)]
    q = L.apply_rope(_qk_norm(ctx, L.split_heads(q, h.n_heads, h.head_dim, major), b + "attn_q_norm"),
                     cos, sin)
    k = L.apply_rope(_qk_norm(ctx, L.split_heads(k, h.n_kv_heads, h.head_dim, major),
                              b + "attn_k_norm"), cos, sin)
    v = L.split_heads(v, h.n_kv_heads, h.head_dim, major)
    window = _layer_window(h, i)
    if ctx.attention is not None:  # e.g. paged attention (see port_spec)
        return ctx.attention.attend(ctx.params, i, q, k, v, h.scale, window)
    k, v = _cache(ctx, i, "key", k), _cache(ctx, i, "value", v)
    return L.merge_heads(L.attend(q, k, v, ctx.masks[window], h, ctx.settings.attention == "manual"),
                         h.n_heads * h.head_dim)


def _norm(ctx: _Context, x: ov.Output, name: str) -> ov.Output:
    return L.rms_norm(x, _vector(ctx.model, name + ".weight"), ctx.h.rms_eps)


def _qk_norm(ctx: _Context, x: ov.Output, name: str) -> ov.Output:
    """qwen3/gemma3: RMSNorm over each head's head_dim values (GGUF's weights as stored)."""
    return _norm(ctx, x, name) if ctx.h.qk_norm else x


def _post_norm(ctx: _Context, x: ov.Output, name: str) -> ov.Output:
    """gemma3 normalizes the attention and MLP outputs before adding them to the residual."""
    return _norm(ctx, x, name) if ctx.h.post_norms else x


def _rows_for_logits(ctx: _Context, x: ov.Output) -> ov.Output:
    """The rows of x [batch, seq, ...] that get logits: ``logits_from``.. (or the attention hook's)."""
    if ctx.attention is not None:
        return ctx.attention.select(ctx.params, x)
    p = ctx.params
    return ops.slice(x, p["logits_from"], const_i64([_MAX]), const_i64([1]), const_i64([1])).output(0)


def _cache(ctx: _Context, layer: int, kind: str, new: ov.Output) -> ov.Output:
    """past ++ new along the sequence axis, stored back to the variable or a present.* output."""
    name = f"past_key_values.{layer}.{kind}"
    if ctx.settings.stateful:
        past, var = L.kv_state(name, ctx.params["input_ids"].output(0),
                               ctx.params["beam_idx"].output(0), ctx.h)
    else:
        past = ctx.params[name].output(0)
    full = ops.concat([past, new], 2)
    if ctx.settings.stateful:
        ctx.sinks.append(ops.assign(full, var))
    else:
        result = ops.result(full)
        result.output(0).get_tensor().set_names({f"present.{layer}.{kind}"})
        ctx.results.append(result)
    return full.output(0)
