"""Each GGUF weight type's form in the graph: its bytes per weight and its decode step, side by side.

    .venv/bin/python benchmarks/weight_types.py [--types Q4_0,Q8_0,Q5_0,...] [--layers 30]
        [--embd 512] [--ff 1536] [--steps 32] [--rounds 3] [--set NAME=VALUE ...]

One synthetic model per type (ovpool.testing.tiny, written once into --dir): SmolLM2-135M's
30 blocks with its widths rounded to whole 256-blocks (512/1536; K-quants need them), a tiny
vocabulary, so the matrices are what is measured. The weights' bytes are those of the graph's
constants (codes, scales, zero points); a decode step is one token after a 32-token prompt,
CPU time on one inference thread (other processes on a shared machine disturb it less), the best
of --rounds rounds that visit every type in turn, so load drifts reach all types alike.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import openvino as ov

from ovpool.settings import Settings, parse_assignments
from ovpool.testing.tiny import TinySpec, tensor_plan
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.graph.builder import build_model
from ovpool.worker.graph.compile_settings import compile_config, resolve_auto
from ovpool.worker.graph.weights import Encoding, int8_groups

TYPES = "Q4_0,Q8_0,Q5_0,Q5_1,Q4_1,Q4_K,Q5_K,Q6_K,Q3_K,Q2_K,IQ4_NL,IQ4_XS"


def feeds(ids: np.ndarray, past: int) -> dict:
    n = ids.shape[1]
    return {"input_ids": ids, "attention_mask": np.ones((1, past + n), np.int64),
            "position_ids": np.arange(past, past + n, dtype=np.int64)[None],
            "beam_idx": np.zeros(1, np.int32), "logits_from": np.array([n - 1], np.int64)}


def weight_bytes(graph: ov.Model) -> int:
    return sum(op.get_byte_size() for op in graph.get_ops() if op.get_type_name() == "Constant")


def decode_ms(request: ov.InferRequest, steps: int) -> float:
    request.reset_state()
    logits = request.infer(feeds(np.arange(32, dtype=np.int64)[None], 0))["logits"]
    start = time.process_time()
    for step in range(steps):
        token = np.array([[int(logits[0, -1].argmax())]], np.int64)
        logits = request.infer(feeds(token, 32 + step))["logits"]
    return (time.process_time() - start) / steps * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default=TYPES)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--embd", type=int, default=512)
    ap.add_argument("--ff", type=int, default=1536)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/ovpool-weight-types")
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args()
    core, root = ov.Core(), Path(args.dir)
    settings = resolve_auto(Settings.resolve(parse_assignments(args.set)), "CPU", core)
    root.mkdir(parents=True, exist_ok=True)
    print(f"settings {settings}", flush=True)
    requests, sizes = {}, {}
    for name in args.types.split(","):
        path = root / f"{name}-{args.layers}x{args.embd}x{args.ff}.gguf"
        if not path.exists():
            _spec(args, name).write(path)
        model = GGUFModel.open(path)
        graph = build_model(model, settings)
        sizes[name] = weight_bytes(graph)
        # As the engine compiles it: activation groups of 16 where weights have 16-weight groups.
        groups = int8_groups(model, Encoding.of(Settings.coerce(settings)))
        config = compile_config(settings, "CPU", core, groups) | {"INFERENCE_NUM_THREADS": 1}
        requests[name] = core.compile_model(graph, "CPU", config).create_infer_request()
    n_weights = sum(int(np.prod(shape)) for _, shape, kind in tensor_plan(_spec(args, "F32"))
                    if kind in ("embed", "matmul"))
    best = {name: float("inf") for name in requests}
    for _ in range(args.rounds):
        for name, request in requests.items():
            best[name] = min(best[name], decode_ms(request, args.steps))
    base = best.get("Q4_0")
    for name in requests:
        ratio = f"  {best[name] / base:.2f}x Q4_0" if base else ""
        print(f"{name:7s} {sizes[name] / 2**20:7.1f} MiB  {sizes[name] / n_weights:.3f} B/weight  "
              f"decode {best[name]:.2f} ms/token{ratio}", flush=True)


def _spec(args, weight_type: str) -> TinySpec:
    return TinySpec(weight_type=weight_type, n_layers=args.layers, n_embd=args.embd, n_ff=args.ff,
                    n_heads=args.embd // 64, n_kv_heads=2, tied=True)


if __name__ == "__main__":
    main()
