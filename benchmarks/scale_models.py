"""Synthetic GGUFs in the real models' shapes for the scale benchmarks (benchmarks/scale.py,
benchmarks/scale_graph_set.py): random weights, a small vocabulary, each written once into a folder;
what a file's weights weigh, whole and read per token; the flags both benchmarks take."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

# name: (architecture, layers, n_embd, heads, kv heads, n_ff): the real models' shapes.
SHAPES = {
    "smollm2-135m": ("llama", 30, 576, 9, 3, 1536),
    "smollm2-360m": ("llama", 32, 960, 15, 5, 2560),
    "qwen2.5-0.5b": ("qwen2", 24, 896, 14, 2, 4864),
    "tinyllama-1.1b": ("llama", 22, 2048, 32, 4, 5632),
    "llama3.2-3b": ("llama", 28, 3072, 24, 8, 8192),
    "llama2-7b": ("llama", 32, 4096, 32, 32, 11008),
}


def parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's flags for its sizes and their files, its decode length and its output."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--sizes", default="smollm2-360m,qwen2.5-0.5b,tinyllama-1.1b")
    p.add_argument("--weight-type", default="Q4_0")
    p.add_argument("--dir", default="/tmp/ovpool-scale")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--json", action="store_true")
    return p


def model_file(name: str, weight_type: str, folder: Path) -> Path:
    """``name``'s file of ``weight_type``: one GGUF type for every matrix, or ``Q4_K_M`` (llama.cpp's
    mix, ``q4_k_m_type``); a name not in ``SHAPES`` is a real model (a path or an alias) as it is."""
    from ovpool.testing.tiny import TinySpec, tensor_plan

    if name not in SHAPES:
        from ovpool.models import resolve_model_path

        return Path(resolve_model_path(name))
    arch, layers, embd, heads, kv, ff = SHAPES[name]
    path = folder / f"{name}-{weight_type}.gguf"
    if not path.exists():
        mix = weight_type == "Q4_K_M"
        spec = TinySpec(arch=arch, weight_type="Q4_K" if mix else weight_type, tied=False,
                        n_layers=layers, n_embd=embd, n_heads=heads, n_kv_heads=kv, n_ff=ff,
                        context_length=2048)
        # TinySpec holds every float weight at once (~4 bytes a parameter): a mix, or a Q4_0 file
        # past 1.5B, is written a tensor at a time instead (Q4_0's 4-bit codes random).
        if mix or (weight_type == "Q4_0" and parameters(name) > 1.5e9):
            types = {n: q4_k_m_type(n, layers) if mix else weight_type
                     for n, _, kind in tensor_plan(spec) if kind in ("matmul", "embed")}
            write_streamed(spec, path.with_suffix(".partial"), types)
        else:
            spec.write(path.with_suffix(".partial"))
        path.with_suffix(".partial").rename(path)
    return path


def q4_k_m_type(name: str, layers: int) -> str:
    """llama.cpp's Q4_K_M choice (llama_tensor_get_type): Q6_K for the output matrix, and for
    attn_v and ffn_down in the first and last eighth of the layers and every third layer between;
    Q4_K for every other matrix."""
    if name == "output.weight":
        return "Q6_K"
    if name.endswith(("attn_v.weight", "ffn_down.weight")):
        i = int(name.split(".")[1])
        if i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2:
            return "Q6_K"
    return "Q4_K"


def write_streamed(spec, path: Path, types: dict[str, str]) -> None:
    """``spec``'s file, each matrix of ``types[name]`` (the rest F32), one tensor in memory
    at a time: Q4_0 matrices as random codes (scales as their float weights would give), the rest
    quantized from random float weights; the metadata as ``TinySpec.write`` makes it."""
    import gguf

    from ovpool.testing import tiny

    rng = np.random.default_rng(spec.seed)
    plan = tiny.tensor_plan(spec)
    writer = gguf.GGUFWriter(str(path), spec.arch)
    tiny._write_hparams(writer, spec)
    tiny.write_tokenizer(writer, spec.vocab, spec.pre or tiny._PRE[spec.arch], spec.add_bos,
                         spec.chat_template)
    for name, shape, _ in plan:
        wtype = types.get(name, "F32")
        if wtype == "F32":
            writer.add_tensor_info(name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
        else:
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[wtype]]
            row = shape[1] // block * size
            writer.add_tensor_info(name, (shape[0], row), np.dtype(np.uint8), shape[0] * row,
                                   raw_dtype=gguf.GGMLQuantizationType[wtype])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, shape, kind in plan:
        writer.write_tensor_data(_tensor(rng, shape, kind, types.get(name, "F32")))
    writer.close()


def _tensor(rng: np.random.Generator, shape: tuple[int, ...], kind: str, weight_type: str) -> np.ndarray:
    import gguf

    from ovpool.testing import tiny

    if weight_type == "Q4_0" and kind == "matmul":
        return _random_q4_0(rng, shape)
    data = tiny._init(rng, shape, kind)
    if weight_type == "F32":
        return data
    if weight_type in tiny.QUANTIZERS:
        return tiny.QUANTIZERS[weight_type](data)
    return gguf.quants.quantize(data, gguf.GGMLQuantizationType[weight_type])


def _random_q4_0(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    rows, blocks = shape[0], shape[1] // 32
    out = np.empty((rows, blocks, 18), np.uint8)
    scale = np.float16(2.5 / np.sqrt(shape[1]) / 8)  # max |w| of a block of N(0, 1/fan_in), over 8
    out[:, :, :2] = np.frombuffer(scale.tobytes(), np.uint8)
    out[:, :, 2:] = rng.integers(0, 256, (rows, blocks, 16), np.uint8)
    return out.reshape(rows, blocks * 18)


def weight_bytes(path: Path, *, per_token: bool = False) -> int:
    """The bytes of the file's tensors; ``per_token``: of those a decode step reads (all but the
    token embedding, which is looked up, not read whole)."""
    from ovpool.worker.gguf.model import GGUFModel

    with GGUFModel.open(path) as model:
        return sum(int(model.raw(n).nbytes) for n in model.tensors
                   if not (per_token and n == "token_embd.weight"))


def parameters(name: str, path: Path | None = None) -> int:
    """The parameters of ``name``'s layers (its embedding and output aside); a real model's
    (``name`` not in ``SHAPES``) from its file's metadata at ``path``."""
    _, layers, e, heads, kv_heads, ff = SHAPES[name] if name in SHAPES else file_shape(path)
    kv = e // heads * kv_heads
    per_layer = [(e, e), (kv, e), (kv, e), (e, e), (ff, e), (ff, e), (e, ff)]
    return int(sum(np.prod(s) for _ in range(layers) for s in per_layer))


def file_shape(path: Path) -> tuple:
    """A GGUF's (architecture, layers, n_embd, heads, kv heads, n_ff), as ``SHAPES`` has them."""
    from ovpool.worker.gguf.model import GGUFModel

    with GGUFModel.open(path) as model:
        meta = model.metadata
    arch = meta["general.architecture"]
    keys = ("block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
            "feed_forward_length")
    return (arch, *(int(meta[f"{arch}.{k}"]) for k in keys))
