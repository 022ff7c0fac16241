"""What bounds an exact (f32) prefill: where a prompt pass spends its time, and how fast this CPU
runs the model's MatMuls at f32 and at bf16.

    .venv/bin/python benchmarks/prefill_bound.py [--model smollm2] [--tokens 512] [--rounds 5]

1. A ``--tokens`` prompt pass on the engine's paged graph (no cache, the default settings), compiled
   with OpenVINO's per-node counters (PERF_COUNT): its CPU time and the share of each node type.
2. The model's MatMul shapes (SmolLM2's: QKV 960x576, output 576x576, gate+up 3072x576, down
   576x1536; 30 layers) alone in one graph, 4-bit codes with an f32 zero point and scale per 32 as
   ovpool.worker.graph.weights builds Q4_1, and the same weights as f32 constants, on a
   ``--tokens``-row pass: GFLOP per CPU second at f32 (AVX-512 FMA; the default's numbers) and at
   bf16 (AMX tiles where the CPU has them; opt-in, not exact). The best of ``--rounds``.
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # rows (outputs), cols (inputs)
LAYERS, GROUP = 30, 32


def node_profile(model: str, tokens: int, rounds: int) -> tuple[float, dict[str, float]]:
    """The best CPU seconds of a ``tokens`` prompt pass, and each node type's share of its time."""
    from ovpool.cache import loader

    compile_model = loader.compile_model
    # Per-node counters need the property at compile time; nothing else of the graph changes.
    loader.compile_model = lambda core, m, device, config: compile_model(core, m, device,
                                                                         {**config, "PERF_COUNT": True})
    from ovpool import Engine

    try:
        engine = Engine(model, cache_dir="", settings={"decode_graph": "off"})
    finally:
        loader.compile_model = compile_model
    session, best = engine._acquire(), float("inf")
    for _ in range(rounds):
        session.reset()
        start = time.process_time()
        session.forward(list(range(1000, 1000 + tokens)), logits_from=tokens - 1)
        best = min(best, time.process_time() - start)
    share: dict[str, float] = collections.defaultdict(float)
    for node in session.runner.requests[0].profiling_info:  # the last pass
        share[f"{node.node_type} ({node.exec_type})"] += node.real_time.total_seconds()
    total = sum(share.values())
    return best, {k: v / total for k, v in sorted(share.items(), key=lambda kv: -kv[1]) if v / total >= 0.005}


def matmuls(compressed: bool):
    """One graph of every layer's MatMuls, each on its own input width."""
    import openvino as ov
    import openvino.opset13 as ops

    rng = np.random.default_rng(0)
    widths = sorted({cols for _, cols in SHAPES})
    inputs = {cols: ops.parameter([-1, -1, cols], ov.Type.f32, name=f"x{cols}") for cols in widths}
    outs = []
    for rows, cols in SHAPES * LAYERS:
        if compressed:
            codes = ops.convert(ops.constant(ov.Tensor(ov.Type.u4, [rows, cols // GROUP, GROUP])), "f32")
            zero = ops.constant(rng.random((rows, cols // GROUP, 1), dtype=np.float32))
            scale = ops.constant(rng.random((rows, cols // GROUP, 1), dtype=np.float32) / 64)
            w = ops.reshape(ops.multiply(ops.subtract(codes, zero), scale),
                            ops.constant(np.array([rows, cols], np.int64)), False)
        else:
            w = ops.constant(rng.random((rows, cols), dtype=np.float32))
        y = ops.matmul(inputs[cols], w, False, True)
        outs.append(ops.reduce_sum(y, ops.constant(np.array([2])), False))
    return ov.Model([ops.concat(outs, 0)], list(inputs.values()))


def matmul_rate(compressed: bool, precision: str, tokens: int, rounds: int) -> float:
    """GFLOP per CPU second of the MatMuls on a ``tokens``-row pass (best of ``rounds``)."""
    import openvino as ov

    compiled = ov.Core().compile_model(matmuls(compressed), "CPU", {
        "INFERENCE_PRECISION_HINT": precision, "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
        "ENABLE_CPU_PINNING": False})
    request = compiled.create_infer_request()
    feeds = {p.get_any_name(): np.random.random((1, tokens, p.get_partial_shape()[2].get_length()))
             .astype(np.float32) for p in compiled.inputs}
    request.infer(feeds)  # the kernels' layouts
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        request.infer(feeds)
        best = min(best, time.process_time() - start)
    return 2 * tokens * LAYERS * sum(r * c for r, c in SHAPES) / best / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    import openvino as ov

    from ovpool.worker.graph.cpu_class import CpuInfo

    print(f"cpu: {CpuInfo.read(ov.Core()).describe()}")
    cpu_s, share = node_profile(args.model, args.tokens, args.rounds)
    print(f"{args.model}, a {args.tokens}-token prompt pass at the defaults: {cpu_s:.3f} CPU s (best of "
          f"{args.rounds}); share of node time:")
    for name, part in share.items():
        print(f"  {100 * part:5.1f}%  {name}")
    print(f"MatMuls of SmolLM2's shapes x {LAYERS} layers, {args.tokens} rows, GFLOP per CPU second:")
    for compressed, precision in ((True, "f32"), (False, "f32"), (True, "bf16")):
        kind = "4-bit codes, f32 zero point and scale" if compressed else "f32 weights"
        rate = matmul_rate(compressed, precision, args.tokens, args.rounds)
        print(f"  {kind:<38} at {precision:<5}{rate:8.0f}")


if __name__ == "__main__":
    main()
