"""A NumPy float32 forward pass of a llama / qwen2 / qwen3 / gemma3 / phi3 GGUF model, the yardstick
for the graph.

Written independently of the OpenVINO path: weights are dequantized with ``gguf.quants`` and RoPE
is applied the way llama.cpp does on GGUF's own row layout (adjacent pairs for llama, whose Q/K rows
the converter permuted; split halves, "NEOX" style, for the others), not via
ovpool.worker.gguf.quants. The gemma3 parts follow llama.cpp's src/models/gemma3.cpp: embedding
times sqrt(n_embd), Q/K RMSNorm, post-norms, GELU(tanh) gate, sliding-window local layers with
their own RoPE base.
"""

from __future__ import annotations

import numpy as np
from gguf import quants

from ovpool.worker.gguf.model import GGUFModel


class Reference:
    rope_dtype = np.float32  # its cos/sin tables (benchmarks/exactness.py's float64 pass: float64)

    def __init__(self, model: GGUFModel):
        self.model, self.h = model, model.hparams
        self._cache: dict[str, np.ndarray] = {}

    def weight(self, name: str) -> np.ndarray:
        if name not in self._cache:
            info = self.model.tensors[name]
            raw = np.asarray(self.model.raw(name)).reshape(*info.shape[:-1], -1)
            self._cache[name] = quants.dequantize(raw, info.ggml_type).astype(np.float32)
        return self._cache[name]

    def logits(self, ids) -> np.ndarray:
        """Teacher-forced logits [len(ids), vocab] for one sequence."""
        return self.hidden(ids) @ self.head().T

    def hidden(self, ids) -> np.ndarray:
        """The output projection's input [len(ids), d] (after the final norm)."""
        h = self.h
        x = self.weight("token_embd.weight")[np.asarray(ids)] * np.float32(h.embed_scale)
        pos = np.arange(len(ids))
        for i in range(h.n_layers):
            x = self._block(i, x, pos)
        return self._norm(x, "output_norm.weight")

    def head(self) -> np.ndarray:
        """The output projection [vocab, d] (the embedding when tied)."""
        return self.weight("token_embd.weight" if self.h.tied_embeddings else "output.weight")

    def _norm(self, x, name):
        x64 = x.astype(np.float64)
        inv = 1.0 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + self.h.rms_eps)
        return (x64 * inv).astype(np.float32) * self.weight(name)

    def _linear(self, x, name):
        y = x @ self.weight(name + ".weight").T
        if name + ".bias" in self.model.tensors:
            y = y + self.weight(name + ".bias")
        return y

    def _rope(self, x, pos, base):
        """x [seq, heads, head_dim] rotated by position, in the GGUF row layout of the arch."""
        d = self.h.head_dim
        inv_freq = base ** (-np.arange(0, d, 2) / d)
        if "rope_freqs.weight" in self.model.tensors:
            inv_freq = inv_freq / self.weight("rope_freqs.weight")
        theta = pos[:, None] * inv_freq  # [seq, d/2]
        cos = np.cos(theta)[:, None, :].astype(self.rope_dtype)
        sin = np.sin(theta)[:, None, :].astype(self.rope_dtype)
        if self.model.architecture == "llama":
            a, b = x[..., 0::2], x[..., 1::2]
        else:
            a, b = x[..., : d // 2], x[..., d // 2:]
        ra, rb = a * cos - b * sin, a * sin + b * cos
        out = np.empty_like(x)
        if self.model.architecture == "llama":
            out[..., 0::2], out[..., 1::2] = ra, rb
        else:
            out[..., : d // 2], out[..., d // 2:] = ra, rb
        return out

    def _attention(self, i, y, pos):
        h, b, n = self.h, f"blk.{i}.", len(pos)
        base = h.rope_base_local if h.local(i) else h.rope_base
        if h.fused_qkv:
            qkv = self._linear(y, b + "attn_qkv")
            cuts = np.cumsum([h.n_heads * h.head_dim, h.n_kv_heads * h.head_dim])
            parts = dict(zip("qkv", np.split(qkv, cuts, axis=-1), strict=True))
        else:
            parts = {c: self._linear(y, b + f"attn_{c}") for c in "qkv"}
        q = parts["q"].reshape(n, h.n_heads, h.head_dim)
        k = parts["k"].reshape(n, h.n_kv_heads, h.head_dim)
        if h.qk_norm:
            q, k = self._norm(q, b + "attn_q_norm.weight"), self._norm(k, b + "attn_k_norm.weight")
        q, k = self._rope(q, pos, base), self._rope(k, pos, base)
        v = parts["v"].reshape(n, h.n_kv_heads, h.head_dim)
        group = h.n_heads // h.n_kv_heads
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) * np.float32(h.scale)
        allowed = np.tril(np.ones((n, n), bool))
        if h.local(i):  # the last sliding_window keys, the query's own included
            allowed &= pos[:, None] - pos[None, :] < h.sliding_window
        scores = np.where(allowed, scores, -np.inf)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return np.einsum("hqk,khd->qhd", p, v).reshape(n, -1)

    def _post_norm(self, x, name):
        return self._norm(x, name) if self.h.post_norms else x

    def _block(self, i, x, pos):
        b = f"blk.{i}."
        attn = self._linear(self._attention(i, self._norm(x, b + "attn_norm.weight"), pos),
                            b + "attn_output")
        x = x + self._post_norm(attn, b + "post_attention_norm.weight")
        y = self._norm(x, b + "ffn_norm.weight")
        if self.h.fused_gate_up:  # phi3: gate then up rows (llama.cpp's ggml_swiglu)
            gate, up = np.split(self._linear(y, b + "ffn_up"), 2, axis=-1)
        else:
            gate, up = self._linear(y, b + "ffn_gate"), self._linear(y, b + "ffn_up")
        if self.h.activation == "gelu_tanh":
            act = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3)))
        else:
            act = gate / (1 + np.exp(-gate))
        return x + self._post_norm(self._linear(act * up, b + "ffn_down"), b + "post_ffw_norm.weight")
