"""Tiny GGUF models for tests and benchmarks: llama, qwen2, qwen3, gemma3 or phi3, any supported
weight type, tied or not.

Weights are deterministic by seed and scaled so logits are well-conditioned (a few units of spread:
not all-equal, not exploding). The metadata carries everything llama.cpp writes for the
architecture plus a real tokenizer (byte-level BPE, or SentencePiece) and a ChatML chat template.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from ovpool.testing.kquants import QUANTIZERS
from ovpool.testing.tiny_vocab import CHATML_TEMPLATE, KINDS, Vocab, vocab, write_tokenizer

WEIGHT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K", "Q5_0", "Q5_1", "Q5_K",
                "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS")
ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3", "phi3")
# llama.cpp's LLAMA_FTYPE values for a file of one weight type (general.file_type).
# (A K-quant file of one type is llama.cpp's _S variant: Q3_K_S, Q5_K_S.)
_FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10,
              "Q3_K": 11, "Q4_K": 15, "Q5_K": 16, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30, "BF16": 32}
_PRE = {"llama": "default", "qwen2": "qwen2", "qwen3": "qwen2", "gemma3": "default", "phi3": "default"}
# gemma3: six layers hold both kinds (five local, one global, as llama.cpp's pattern of 6 has
# them), and a window shorter than the test prompts, so sliding matters.
_LAYERS = {"gemma3": 6}
GEMMA3_WINDOW = 5


def default_dims(weight_type: str) -> tuple[int, int]:
    """(n_embd, n_ff): the smallest sizes whose rows fit whole quantization blocks."""
    block = gguf.GGML_QUANT_SIZES[QT[weight_type]][0]
    return max(64, block), max(128, block)


@dataclass(frozen=True)
class TinySpec:
    """Everything that determines a tiny model file. ``n_embd``/``n_ff`` 0: ``default_dims``."""

    arch: str = "llama"
    weight_type: str = "Q4_1"
    tied: bool = True
    seed: int = 0
    n_layers: int = 0            # 0: 2, or the architecture's own (_LAYERS)
    n_embd: int = 0
    n_heads: int = 4
    n_kv_heads: int = 2
    n_ff: int = 0
    context_length: int = 256
    n_merges: int = 300
    add_bos: bool = True
    tokenizer: str = "bpe"       # or "spm": a SentencePiece vocabulary (tokenizer.ggml.model=llama)
    pre: str = ""                # tokenizer.ggml.pre of a BPE vocabulary; "": default for the arch
    embed_type: str = ""         # token_embd/output's weight type; "": weight_type (a real gemma3
                                 # file has a Q8_0 embedding beside Q5_0/Q4_K/Q6_K matrices)
    chat_template: str = CHATML_TEMPLATE  # e.g. tiny_vocab.QWEN_TOOLS_TEMPLATE (tools in it)

    def __post_init__(self) -> None:
        object.__setattr__(self, "embed_type", self.embed_type or self.weight_type)
        if self.arch not in ARCHITECTURES or not {self.weight_type, self.embed_type} <= set(WEIGHT_TYPES):
            raise ValueError(f"arch must be one of {ARCHITECTURES}, weight_type and embed_type one "
                             f"of {WEIGHT_TYPES}")
        embd, ff = np.maximum(default_dims(self.weight_type), default_dims(self.embed_type)).tolist()
        object.__setattr__(self, "n_embd", self.n_embd or embd)
        object.__setattr__(self, "n_ff", self.n_ff or ff)
        object.__setattr__(self, "n_layers", self.n_layers or _LAYERS.get(self.arch, 2))
        if self.tokenizer not in KINDS:
            raise ValueError(f"tokenizer must be one of {KINDS}")
        if self.n_embd % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError("n_embd must divide by n_heads, and n_heads by n_kv_heads")

    @property
    def tokens(self) -> list[str]:
        return self.vocab.tokens

    @property
    def vocab(self) -> Vocab:
        return vocab(self.tokenizer, self.n_merges)

    def weights(self) -> dict[str, np.ndarray]:
        """The float32 weights before quantization, deterministic by seed."""
        rng = np.random.default_rng(self.seed)
        return {name: _init(rng, shape, kind) for name, shape, kind in tensor_plan(self)}

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        writer = gguf.GGUFWriter(str(path), self.arch)
        _write_hparams(writer, self)
        write_tokenizer(writer, self.vocab, self.pre or _PRE[self.arch], self.add_bos, self.chat_template)
        kinds = {name: kind for name, _, kind in tensor_plan(self)}
        types = {"embed": self.embed_type, "matmul": self.weight_type}
        for name, data in self.weights().items():
            _add_tensor(writer, name, data, types.get(kinds[name], "F32"))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path


def write_tiny_model(path: str | Path, arch: str = "llama", weight_type: str = "Q4_1", tied: bool = True,
                     seed: int = 0, **spec) -> Path:
    """Writes a tiny model (see ``TinySpec`` for the other fields) and returns its path."""
    return TinySpec(arch=arch, weight_type=weight_type, tied=tied, seed=seed, **spec).write(path)


def tensor_plan(spec: TinySpec) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape [out, in], kind) of every tensor; kind is embed, matmul, norm or bias."""
    e, ff, v = spec.n_embd, spec.n_ff, len(spec.tokens)
    kv = e // spec.n_heads * spec.n_kv_heads
    plan = [("token_embd.weight", (v, e), "embed")]
    for i in range(spec.n_layers):
        b = f"blk.{i}."
        plan.append((b + "attn_norm.weight", (e,), "norm"))
        if spec.arch == "phi3":  # fused Q, K, V rows
            plan.append((b + "attn_qkv.weight", (e + 2 * kv, e), "matmul"))
        else:
            plan += [(b + "attn_q.weight", (e, e), "matmul"), (b + "attn_k.weight", (kv, e), "matmul"),
                     (b + "attn_v.weight", (kv, e), "matmul")]
        if spec.arch == "qwen2":
            plan += [(b + "attn_q.bias", (e,), "bias"), (b + "attn_k.bias", (kv,), "bias"),
                     (b + "attn_v.bias", (kv,), "bias")]
        if spec.arch in ("qwen3", "gemma3"):
            plan += [(b + "attn_q_norm.weight", (e // spec.n_heads,), "norm"),
                     (b + "attn_k_norm.weight", (e // spec.n_heads,), "norm")]
        plan += [(b + "attn_output.weight", (e, e), "matmul")]
        if spec.arch == "gemma3":
            plan += [(b + "post_attention_norm.weight", (e,), "norm"),
                     (b + "post_ffw_norm.weight", (e,), "norm")]
        plan.append((b + "ffn_norm.weight", (e,), "norm"))
        if spec.arch == "phi3":  # gate and up rows in one ffn_up
            plan.append((b + "ffn_up.weight", (2 * ff, e), "matmul"))
        else:
            plan += [(b + "ffn_gate.weight", (ff, e), "matmul"), (b + "ffn_up.weight", (ff, e), "matmul")]
        plan.append((b + "ffn_down.weight", (e, ff), "matmul"))
    plan.append(("output_norm.weight", (e,), "norm"))
    if not spec.tied:
        plan.append(("output.weight", (v, e), "embed"))
    return plan


def _init(rng: np.random.Generator, shape: tuple[int, ...], kind: str) -> np.ndarray:
    if kind == "norm":
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if kind == "bias":
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    # 1/sqrt(fan_in) keeps activations O(1); the vocabulary matrix gets twice that so the logits
    # of a normalized hidden state spread about two units.
    std = (2.0 if kind == "embed" else 1.0) / np.sqrt(shape[1])
    return (std * rng.standard_normal(shape)).astype(np.float32)


def _add_tensor(writer: gguf.GGUFWriter, name: str, data: np.ndarray, weight_type: str) -> None:
    qtype = QT[weight_type]
    if weight_type == "F32":
        writer.add_tensor(name, data)
    elif weight_type == "F16":
        writer.add_tensor(name, data.astype(np.float16))
    elif weight_type in QUANTIZERS:
        writer.add_tensor(name, QUANTIZERS[weight_type](data), raw_dtype=qtype)
    else:
        writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)


def _write_hparams(writer: gguf.GGUFWriter, spec: TinySpec) -> None:
    writer.add_name(f"tiny-{spec.arch}-{spec.weight_type.lower()}")
    writer.add_file_type(_FILE_TYPE[spec.weight_type])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layers)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_heads)
    writer.add_head_count_kv(spec.n_kv_heads)
    if spec.arch != "gemma3":
        writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(spec.n_embd // spec.n_heads)
    writer.add_vocab_size(len(spec.tokens))
    if spec.arch == "gemma3":
        writer.add_key_length(spec.n_embd // spec.n_heads)
        writer.add_value_length(spec.n_embd // spec.n_heads)
        writer.add_sliding_window(GEMMA3_WINDOW)
        writer.add_rope_freq_base(1e6)  # global layers; local ones use 10000
