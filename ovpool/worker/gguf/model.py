"""A GGUF language model: metadata, validated hyper-parameters, tensor descriptors, lazy weights.

Opening a model reads only the GGUF header (ovpool.worker.gguf.file). Weight bytes are reached
through ``GGUFModel.raw(name)``, a read-only memmap slice, and nothing else.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T

from ovpool.errors import ModelFormatError, UnsupportedModelError
from ovpool.models import ALIASES, resolve_model_path
from ovpool.worker.gguf.file import TensorInfo, read_header

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3", "phi3")
WEIGHT_TYPES = frozenset({T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q6_K, T.Q5_0, T.Q5_1,
                          T.Q5_K, T.Q3_K, T.Q2_K, T.IQ4_NL, T.IQ4_XS})
_NORM_TYPES = frozenset({T.F32, T.F16, T.BF16})
ROPE_FREQS = "rope_freqs.weight"  # per-frequency divisors (Llama 3.1 long-context RoPE)


@dataclass(frozen=True)
class HParams:
    n_layers: int
    n_embd: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_ff: int
    vocab_size: int
    context_length: int
    rope_base: float
    rms_eps: float
    rope_dim: int
    tied_embeddings: bool
    qkv_bias: bool
    # Beyond llama/qwen2 (defaults: theirs). qwen3 and gemma3 RMS-normalize each head of Q and K
    # before RoPE; gemma3 also scales the embedding, wraps attention and MLP in post-norms, gates
    # the MLP with GELU(tanh) and alternates sliding-window (local) and global layers.
    qk_norm: bool = False
    fused_qkv: bool = False  # phi3: one attn_qkv matrix, rows Q then K then V
    fused_gate_up: bool = False  # phi3: ffn_up holds gate then up rows (llama.cpp's ggml_swiglu)
    embed_scale: float = 1.0
    attn_scale: float = 0.0  # softmax scale of q·k; 0: 1/sqrt(head_dim)
    post_norms: bool = False
    activation: str = "silu"  # or "gelu_tanh"
    sliding_window: int = 0  # keys a local layer's query sees, itself included
    local_layers: tuple[int, ...] = ()
    rope_base_local: float = 10000.0

    @property
    def scale(self) -> float:
        return self.attn_scale or 1.0 / float(np.sqrt(self.head_dim))

    def local(self, layer: int) -> bool:
        return layer in self.local_layers


class GGUFModel:
    """One opened GGUF model. Use ``GGUFModel.open(path_or_alias)``."""

    def __init__(self, path: Path, metadata: dict[str, Any], tensors: dict[str, TensorInfo], alias=None):
        self.path, self.metadata, self.tensors, self.alias = path, metadata, tensors, alias
        self.architecture = _architecture(metadata)
        self.hparams = read_hparams(self.architecture, metadata, tensors)
        _check_tensors(self.architecture, self.hparams, tensors)
        self._memmap: np.memmap | None = None

    @classmethod
    def open(cls, model: str | Path) -> GGUFModel:
        path = resolve_model_path(model)
        header = read_header(path)
        alias = str(model).lower() if str(model).lower() in ALIASES else None
        return cls(path, header.metadata, header.tensors, alias)

    @property
    def name(self) -> str:
        return self.alias or self.path.stem

    def close(self) -> None:
        """Drop the weight mapping (a compiled model no longer needs it); ``raw`` maps again."""
        self._memmap = None

    def __enter__(self) -> GGUFModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def raw(self, name: str) -> np.ndarray:
        """The quantized bytes of tensor ``name`` as a read-only uint8 memmap slice."""
        info = self.tensors[name]
        if self._memmap is None:
            self._memmap = np.memmap(self.path, mode="r")
        return self._memmap[info.offset:info.offset + info.nbytes]

    def release(self, name: str) -> None:
        """Drop the pages of tensor ``name`` that this process has read (its constants are
        copies): the page cache keeps them, and ``raw`` reads them again if asked. Without it a
        build holds every weight twice at its end, the file's pages and the built constants
        (docs/performance.md, gemma3-270m against llama.cpp)."""
        if self._memmap is None:
            return
        info, page = self.tensors[name], mmap.PAGESIZE
        start = info.offset // page * page
        end = min(-(-(info.offset + info.nbytes) // page) * page, self._memmap.size)
        self._memmap._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)


def _architecture(metadata: dict[str, Any]) -> str:
    arch = metadata.get("general.architecture")
    if arch is None:
        raise ModelFormatError("GGUF key general.architecture is missing")
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(f"architecture {arch!r} (general.architecture) is not supported; "
                                    f"supported: {', '.join(ARCHITECTURES)}")
    return arch


class _Fields:
    """Typed reads of ``{arch}.*`` keys; a wrong or missing one is an error naming the key."""

    def __init__(self, arch: str, metadata: dict[str, Any]):
        self.arch, self.metadata = arch, metadata

    def get(self, suffix: str, kind: type, default: Any = None, positive: bool = True) -> Any:
        key = f"{self.arch}.{suffix}"
        value = self.metadata.get(key, default)
        if value is None:
            raise ModelFormatError(f"GGUF key {key} is missing")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (kind is int and not isinstance(value, int)):
            raise ModelFormatError(f"GGUF key {key} = {value!r} is not a {kind.__name__}")
        if positive and not value > 0:
            raise ModelFormatError(f"GGUF key {key} = {value!r} must be positive")
        return kind(value)


def read_hparams(arch: str, metadata: dict[str, Any], tensors: dict[str, TensorInfo]) -> HParams:
    f = _Fields(arch, metadata)
    n_embd, n_heads = f.get("embedding_length", int), f.get("attention.head_count", int)
    n_kv_heads = f.get("attention.head_count_kv", int, n_heads)
    if n_heads % n_kv_heads:
        raise ModelFormatError(f"GGUF key {arch}.attention.head_count_kv = {n_kv_heads} does not "
                               f"divide {arch}.attention.head_count = {n_heads}")
    if f.get("attention.key_length", int, 0, False) == 0 and n_embd % n_heads:
        raise ModelFormatError(f"GGUF key {arch}.embedding_length = {n_embd} is not a multiple of "
                               f"{arch}.attention.head_count = {n_heads}")
    head_dim = f.get("attention.key_length", int, n_embd // n_heads)
    if f.get("attention.value_length", int, head_dim) != head_dim:
        raise UnsupportedModelError(f"GGUF key {arch}.attention.value_length differs from key_length")
    rope_dim = f.get("rope.dimension_count", int, head_dim)
    if rope_dim > head_dim or rope_dim % 2:
        raise ModelFormatError(f"GGUF key {arch}.rope.dimension_count = {rope_dim} must be even and "
                               f"at most the head size {head_dim}")
    for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
        if name in tensors:  # Phi-3.5 / Phi-4-mini (128k context) files
            raise UnsupportedModelError(f"tensor {name}: LongRoPE is not supported")
    scaling = metadata.get(f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise UnsupportedModelError(f"GGUF key {arch}.rope.scaling.type = {scaling!r}: RoPE scaling "
                                    "is not supported")
    n_layers = f.get("block_count", int)
    return HParams(
        n_layers=n_layers, n_embd=n_embd, n_heads=n_heads, n_kv_heads=n_kv_heads,
        head_dim=head_dim, n_ff=f.get("feed_forward_length", int),
        vocab_size=_vocab_size(f, tensors), context_length=f.get("context_length", int),
        rope_base=f.get("rope.freq_base", float, 10000.0),
        rms_eps=f.get("attention.layer_norm_rms_epsilon", float),
        rope_dim=rope_dim, tied_embeddings="output.weight" not in tensors,
        qkv_bias="blk.0.attn_q.bias" in tensors, qk_norm=arch in ("qwen3", "gemma3"),
        fused_qkv="blk.0.attn_qkv.weight" in tensors, fused_gate_up=arch == "phi3",
        **(_gemma3(f, n_layers, n_embd, n_heads, head_dim) if arch == "gemma3" else {}),
    )


# llama.cpp (llama-model.cpp, LLM_ARCH_GEMMA3): set_swa_pattern(6) makes every sixth layer global
# and the others local; local layers use RoPE base 10000 whatever the GGUF says, global ones
# {arch}.rope.freq_base. The softmax scale is 1/sqrt(head_dim) (query_pre_attn_scalar = head_dim)
# except on the 62-layer 27B, whose query_pre_attn_scalar is n_embd / n_heads. Its graph with a
# sliding window applies no final-logit soft-capping (the GGUF key is ignored, as there).
GEMMA3_PATTERN, GEMMA3_LOCAL_BASE = 6, 10000.0


def _gemma3(f: _Fields, n_layers: int, n_embd: int, n_heads: int, head_dim: int) -> dict[str, Any]:
    window = f.get("attention.sliding_window", int)
    return {"embed_scale": float(np.sqrt(np.float32(n_embd))), "post_norms": True,
            "activation": "gelu_tanh", "sliding_window": window,
            "attn_scale": 1.0 / float(np.sqrt(n_embd // n_heads if n_layers == 62 else head_dim)),
            "local_layers": tuple(i for i in range(n_layers) if i % GEMMA3_PATTERN < GEMMA3_PATTERN - 1),
            "rope_base_local": GEMMA3_LOCAL_BASE}


def _vocab_size(f: _Fields, tensors: dict[str, TensorInfo]) -> int:
    if "token_embd.weight" not in tensors:
        raise ModelFormatError("tensor token_embd.weight is missing")
    rows = tensors["token_embd.weight"].shape[0]
    tokens = f.metadata.get("tokenizer.ggml.tokens")
    return f.get("vocab_size", int, len(tokens) if tokens is not None else rows)


def _expected_shapes(h: HParams, arch: str) -> dict[str, tuple[int, ...]]:
    q, kv = h.n_heads * h.head_dim, h.n_kv_heads * h.head_dim
    shapes = {"token_embd.weight": (h.vocab_size, h.n_embd), "output_norm.weight": (h.n_embd,),
              ROPE_FREQS: (h.rope_dim // 2,)}
    if not h.tied_embeddings:
        shapes["output.weight"] = (h.vocab_size, h.n_embd)
    for i in range(h.n_layers):
        b = f"blk.{i}."
        shapes |= {b + "attn_norm.weight": (h.n_embd,), b + "ffn_norm.weight": (h.n_embd,)}
        if h.fused_qkv:
            shapes[b + "attn_qkv.weight"] = (q + 2 * kv, h.n_embd)
        else:
            shapes |= {b + "attn_q.weight": (q, h.n_embd), b + "attn_k.weight": (kv, h.n_embd),
                       b + "attn_v.weight": (kv, h.n_embd)}
        shapes[b + "attn_output.weight"] = (h.n_embd, q)
        if h.fused_gate_up:
            shapes[b + "ffn_up.weight"] = (2 * h.n_ff, h.n_embd)
        else:
            shapes |= {b + "ffn_gate.weight": (h.n_ff, h.n_embd), b + "ffn_up.weight": (h.n_ff, h.n_embd)}
        shapes[b + "ffn_down.weight"] = (h.n_embd, h.n_ff)
        if h.qkv_bias or arch == "qwen2":
            shapes |= {b + "attn_q.bias": (q,), b + "attn_k.bias": (kv,), b + "attn_v.bias": (kv,)}
        if h.qk_norm:
            shapes |= {b + "attn_q_norm.weight": (h.head_dim,), b + "attn_k_norm.weight": (h.head_dim,)}
        if h.post_norms:
            shapes |= {b + "post_attention_norm.weight": (h.n_embd,),
                       b + "post_ffw_norm.weight": (h.n_embd,)}
    return shapes


def _check_tensors(arch: str, h: HParams, tensors: dict[str, TensorInfo]) -> None:
    for name, shape in _expected_shapes(h, arch).items():
        info = tensors.get(name)
        if info is None and name == ROPE_FREQS:
            continue
        if info is None:
            raise ModelFormatError(f"tensor {name} is missing")
        if info.shape != shape:
            raise ModelFormatError(f"tensor {name} has shape {list(info.shape)}, expected "
                                   f"{list(shape)} from the model's hyper-parameters")
        allowed = _NORM_TYPES if len(shape) == 1 else WEIGHT_TYPES
        if info.ggml_type not in allowed:
            raise UnsupportedModelError(f"tensor {name} has weight type {info.ggml_type.name}; "
                                        f"supported: {', '.join(sorted(t.name for t in allowed))}")
