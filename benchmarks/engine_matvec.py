"""One compressed mat-vec per weight encoding, as the CPU plugin runs it (CPU time, one thread).

    .venv/bin/python benchmarks/engine_matvec.py [--rows 3072] [--cols 576] [--tokens 1] [--precision f32]

CPU time rather than wall time so that other processes on a shared machine disturb it less.
The encodings are those ovpool.worker.gguf.quants produces (i4 + exact float zero point for Q4_1/Q4_K, or
u4 + rounded zero point + exact offset where the CPU has an int8 path, or i4 + an offset term beside the
MatMul with ``zero_points=offset``; i8 for Q8_0/Q6_K) and GenAI's (u4 + rounded u4 zero point) for
comparison. ``--precision bf16`` runs them as a VNNI/AMX CPU does by default
(int8 activations where the zero point is an integer).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from ovpool.worker.gguf.quants import Packed, integer_zero
from ovpool.worker.graph.cpu_class import CpuInfo
from ovpool.worker.graph.weights import Weight


def cpu_ms(packed: Packed, tokens: int, rng: np.random.Generator, precision: str = "f32",
           calls: int = 200) -> float:
    rows, cols = packed.shape
    x = ops.parameter([-1, -1, cols], ov.Type.f32, name="x")
    model = ov.Model([ops.result(Weight(packed, "w").linear(x.output(0))[0])], [x])
    config = {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": precision}
    if precision == "f32":
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = 0  # as ovpool compiles f32 (exact)
    request = ov.Core().compile_model(model, "CPU", config).create_infer_request()
    xs = rng.standard_normal((1, tokens, cols)).astype(np.float32)
    for _ in range(20):
        request.infer([xs])
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(calls):
            request.infer([xs])
        best = min(best, (time.process_time() - start) / calls)
    return best * 1000


def encodings(rows: int, cols: int, rng: np.random.Generator) -> dict[str, Packed]:
    g = cols // 32
    nibbles = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
    scale = (rng.random((rows, g)) * 0.01).astype(np.float16)
    zero = rng.integers(0, 16, (rows, g), dtype=np.uint8)
    exact_zero = (rng.standard_normal((rows, g)) * 3).astype(np.float32)
    bytes8 = rng.integers(-128, 128, (rows, cols), dtype=np.int8)
    shape = (rows, cols)
    return {
        "u4 + u4 zero point (GenAI Q4_1)": Packed(nibbles, "u4", shape, 32, scale, zero),
        "i4 + f32 zero point (ovpool Q4_1)": Packed(nibbles, "i4", shape, 32, scale, exact_zero),
        "i4 + offset term (zero_points=offset)": Packed(nibbles, "i4", shape, 32, scale,
                                                        offset=scale * exact_zero),
        "u4 + u4 zero point + offset (Q4_1, int8)": integer_zero(Packed(nibbles, "i4", shape, 32, scale,
                                                                        exact_zero)),
        "i4 symmetric (Q4_0)": Packed(nibbles, "i4", shape, 32, scale),
        "i8 symmetric (Q8_0)": Packed(bytes8, "i8", shape, 32, scale),
        "i8, f32 scale per 16 (Q6_K)": Packed(bytes8, "i8", shape, 16,
                                              np.repeat(scale, 2, axis=1).astype(np.float32)),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=3072)
    ap.add_argument("--cols", type=int, default=576)
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--precision", default="f32", choices=("f32", "bf16", "f16"))
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"cpu: {CpuInfo.read(ov.Core()).describe()}, precision {args.precision}")
    for label, packed in encodings(args.rows, args.cols, rng).items():
        print(f"{label:42s} {cpu_ms(packed, args.tokens, rng, args.precision):.3f} ms", flush=True)


if __name__ == "__main__":
    main()
