"""A toy graph for cache tests: a few ops with a dynamic Parameter and constant weights.

Used in-process by the tests and as a child process (``python tests/cache_toy.py CACHE_DIR
MODEL_FILE [--cache-only] [--set k=v] [--lock-timeout S] [--ir]``) that loads through ``load_compiled``
(``--ir``: through ``ovpool.cache.ir.load_ir``, then compiles), runs one inference and prints
``RESULT <outcome> <entry> <digest of the output>`` on stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
from pathlib import Path

import numpy as np
import openvino as ov
from openvino import opset13 as ops

from ovpool.cache.fingerprint import GraphIdentity
from ovpool.cache.ir import load_ir
from ovpool.cache.loader import load_compiled

VOCAB, DIM = 64, 32


def ports(static: bool = False, extra: bool = False) -> list[dict[str, str]]:
    seq = "[1,4]" if static else "[?,?]"
    rows = [{"name": "input_ids", "direction": "in", "element_type": "i64", "partial_shape": seq},
            {"name": "logits", "direction": "out", "element_type": "f32",
             "partial_shape": seq[:-1] + f",{VOCAB}]"}]
    if extra:
        rows.append({"name": "position_ids", "direction": "in", "element_type": "i64",
                     "partial_shape": seq})
    return rows


def identity(model_file: Path, settings: dict | None = None, **port_flags) -> GraphIdentity:
    descriptors = [("token_embd.weight", "F32", (VOCAB, DIM), 64),
                   ("output.weight", "F32", (DIM, VOCAB), 8256)]
    return GraphIdentity(sources=[(str(model_file), descriptors)], architecture="toy",
                         hparams={"n_embd": DIM, "vocab_size": VOCAB}, builder_hash="toy-builder-1",
                         ports=ports(**port_flags),
                         settings={"kv_cache_precision": "f16", **(settings or {})})


def build(static: bool = False, extra: bool = False, calls: list | None = None) -> ov.Model:
    if calls is not None:
        calls.append(1)
    rng = np.random.default_rng(7)
    shape = ov.PartialShape([1, 4] if static else [-1, -1])
    ids = ops.parameter(shape, ov.Type.i64, name="input_ids")
    params = [ids]
    emb = ops.gather(ops.constant(rng.standard_normal((VOCAB, DIM)).astype(np.float32)), ids, 0)
    if extra:
        pos = ops.parameter(shape, ov.Type.i64, name="position_ids")
        params.append(pos)
        emb = ops.add(emb, ops.unsqueeze(ops.convert(pos, ov.Type.f32), ops.constant(np.int64(-1))))
    logits = ops.matmul(emb, ops.constant(rng.standard_normal((DIM, VOCAB)).astype(np.float32)), False, False)
    logits.output(0).set_names({"logits"})
    return ov.Model([logits], params, "toy")


def run(compiled: ov.CompiledModel, extra: bool = False) -> np.ndarray:
    ids = np.array([[1, 2, 3, 4]], dtype=np.int64)
    inputs = {"input_ids": ids, "position_ids": ids} if extra else {"input_ids": ids}
    return compiled.create_infer_request().infer(inputs)["logits"].copy()


def digest(logits: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(logits).tobytes()).hexdigest()[:16]


def read_ir(xml: bytes, weights: ov.Tensor) -> ov.Model:
    return ov.Core().read_model(xml.decode(), weights)


def load(args: argparse.Namespace, settings: dict) -> tuple[str, str | None, ov.CompiledModel, object]:
    """(outcome, entry, compiled model, the owner of the blob's mapping it may run on)."""
    common = {"identity": identity(args.model_file, settings), "device": "CPU", "config": {},
              "build": build, "cache_dir": args.cache_dir, "cache_only": args.cache_only,
              "lock_timeout_s": args.lock_timeout}
    if args.ir:
        result = load_ir(ov.Core(), read=read_ir, **common)
        return result.outcome, result.entry, ov.Core().compile_model(result.model, "CPU"), result.weights
    result = load_compiled(ov.Core(), **common)
    return result.outcome, result.entry, result.compiled, result.blob


def result(argv: list[str]) -> tuple[str, str | None, str]:
    """(outcome, entry, digest of the output) for the command line ``argv``; in-process, it is
    what the child prints, without paying for a process start."""
    ap = argparse.ArgumentParser()
    ap.add_argument("cache_dir")
    ap.add_argument("model_file", type=Path)
    ap.add_argument("--cache-only", action="store_true")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--lock-timeout", type=float, default=-1)
    ap.add_argument("--ir", action="store_true")
    args = ap.parse_args(argv)
    outcome, entry, compiled, _owner = load(args, dict(item.split("=", 1) for item in args.set))
    return outcome, entry, digest(run(compiled))  # _owner keeps the blob mapped until here


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
    print("RESULT", *result(argv), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
