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
    from ovpool.testing.tiny import TinySpec

    arch, layers, embd, heads, kv, ff = SHAPES[name]
    path = folder / f"{name}-{weight_type}.gguf"
    if not path.exists():
        spec = TinySpec(arch=arch, weight_type=weight_type, tied=False, n_layers=layers, n_embd=embd,
                        n_heads=heads, n_kv_heads=kv, n_ff=ff, context_length=2048)
        # TinySpec holds every float weight at once (~4 bytes a parameter): past 1.5B a Q4_0 file
        # is written a tensor at a time instead, its 4-bit codes random.
        if weight_type == "Q4_0" and parameters(name) > 1.5e9:
            write_streamed(spec, path.with_suffix(".partial"))
        else:
            spec.write(path.with_suffix(".partial"))
        path.with_suffix(".partial").rename(path)
    return path


def write_streamed(spec, path: Path) -> None:
    """``spec``'s file with random Q4_0 codes for its matrices (scales as its float weights would
    give), one tensor in memory at a time; the rest as ``TinySpec.write`` makes it."""
    import gguf

    from ovpool.testing import tiny

    rng = np.random.default_rng(spec.seed)
    plan = tiny.tensor_plan(spec)
    writer = gguf.GGUFWriter(str(path), spec.arch)
    tiny._write_hparams(writer, spec)
    tiny.write_tokenizer(writer, spec.vocab, spec.pre or tiny._PRE[spec.arch], spec.add_bos,
                         spec.chat_template)
    small = {n: _quantized(tiny._init(rng, shape, kind), kind, spec)
             for n, shape, kind in plan if kind != "matmul"}
    for name, shape, kind in plan:
        data = small.get(name)
        nbytes = shape[0] * shape[1] // 32 * 18 if data is None else data.nbytes
        raw = gguf.GGMLQuantizationType.Q4_0 if data is None else _raw_type(data, kind, spec)
        byte_shape = (shape[0], shape[1] // 32 * 18) if data is None else data.shape
        dtype = np.dtype(np.uint8) if data is None else data.dtype
        writer.add_tensor_info(name, byte_shape, dtype, nbytes, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, shape, _ in plan:
        writer.write_tensor_data(small[name] if name in small else _random_q4_0(rng, shape))
    writer.close()


def _random_q4_0(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    rows, blocks = shape[0], shape[1] // 32
    out = np.empty((rows, blocks, 18), np.uint8)
    scale = np.float16(2.5 / np.sqrt(shape[1]) / 8)  # max |w| of a block of N(0, 1/fan_in), over 8
    out[:, :, :2] = np.frombuffer(scale.tobytes(), np.uint8)
    out[:, :, 2:] = rng.integers(0, 256, (rows, blocks, 16), np.uint8)
    return out.reshape(rows, blocks * 18)


def _quantized(data: np.ndarray, kind: str, spec) -> np.ndarray:
    import gguf

    if kind != "embed":
        return data  # norms and biases stay F32, as TinySpec writes them
    return gguf.quants.quantize(data, gguf.GGMLQuantizationType[spec.embed_type])


def _raw_type(data: np.ndarray, kind: str, spec):
    import gguf

    return gguf.GGMLQuantizationType[spec.embed_type] if kind == "embed" else gguf.GGMLQuantizationType.F32


def weight_bytes(path: Path, *, per_token: bool = False) -> int:
    """The bytes of the file's tensors; ``per_token``: of those a decode step reads (all but the
    token embedding, which is looked up, not read whole)."""
    from ovpool.worker.gguf.model import GGUFModel

    with GGUFModel.open(path) as model:
        return sum(int(model.raw(n).nbytes) for n in model.tensors
                   if not (per_token and n == "token_embd.weight"))


def parameters(name: str) -> int:
    """The parameters of ``name``'s layers (its embedding and output aside)."""
    _, layers, e, heads, kv_heads, ff = SHAPES[name]
    kv = e // heads * kv_heads
    per_layer = [(e, e), (kv, e), (kv, e), (e, e), (ff, e), (ff, e), (e, ff)]
    return int(sum(np.prod(s) for _ in range(layers) for s in per_layer))
