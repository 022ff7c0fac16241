"""Where a decode step's time goes: the CPU plugin's per-node times (PERF_COUNT) summed by node type
and by weight role over every layer (GGUF type and role: Q4_K ffn_down, Q6_K attn_v, ...), beside the
step's own wall time (infer()).

    .venv/bin/python benchmarks/decode_profile.py --model FILE [--set NAME=VALUE ...] [--steps 12]
        [--threads N]

ovpool's stateful graph alone (benchmarks/engine_graph.py's feeds), a 64-token prompt, then
``--steps`` one-token steps; the first two are left out. Each MatMul is named after the weight it
reads. Node times are the plugin's own (real time per node, summed): under load they overstate the
step, so compare two models or settings in the same state of the host.
"""

from __future__ import annotations

import argparse
import re
import time
from collections import defaultdict

import numpy as np
import openvino as ov
from engine_graph import feeds

from ovpool.settings import Settings, parse_assignments
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.graph.builder import build_model
from ovpool.worker.graph.compile_settings import compile_config


def name_matmuls(graph: ov.Model, model: GGUFModel) -> None:
    """Each weight MatMul renamed 'TYPE:role' (role: the tensor name without its layer)."""
    for op in graph.get_ops():
        if op.get_type_name() != "MatMul":
            continue
        node = op.input_value(1).get_node()
        while node.get_type_name() != "Constant" and node.get_input_size():
            node = node.input_value(0).get_node()
        first = node.get_friendly_name().split("+")[0]
        if first in model.tensors:
            role = re.sub(r"blk\.\d+\.", "", node.get_friendly_name())
            op.set_friendly_name(f"{model.tensors[first].ggml_type.name}:{role}")


def profile(path: str, assignments: list[str], steps: int, threads: int = 0) -> tuple[dict, dict, float]:
    """Per step, milliseconds by (node type, kernel) and by weight role; the median infer() wall."""
    settings = Settings.resolve(parse_assignments(assignments))
    model = GGUFModel.open(path)
    graph = build_model(model, settings)
    name_matmuls(graph, model)
    core = ov.Core()
    config = compile_config(settings, "CPU", core) | {"PERF_COUNT": True, "INFERENCE_NUM_THREADS": threads}
    request = core.compile_model(graph, "CPU", config).create_infer_request()
    prompt = np.random.default_rng(0).integers(0, model.hparams.vocab_size, (1, 64))
    request.infer(feeds(prompt, 0, True))
    kinds, weights, walls = defaultdict(float), defaultdict(float), []
    for step in range(steps):
        inputs = feeds(np.array([[5]], np.int64), 64 + step, True)
        start = time.perf_counter()
        request.infer(inputs)
        walls.append(1000 * (time.perf_counter() - start))
        for node in request.profiling_info if step >= 2 else ():
            ms = node.real_time.total_seconds() * 1000 / (steps - 2)
            kinds[(node.node_type, node.exec_type)] += ms
            if ":" in node.node_name:  # one role: the plugin numbers each layer's copy of a name
                weights[re.sub(r"_\d+$", "", node.node_name)] += ms
    return kinds, weights, float(np.median(walls[2:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=0, help="INFERENCE_NUM_THREADS (0: every core)")
    args = ap.parse_args()
    kinds, weights, wall = profile(args.model, args.set, max(args.steps, 3), args.threads)
    print(f"node time per step {sum(kinds.values()):.1f} ms; infer() wall per step (median) {wall:.1f} ms")
    for table in (kinds, weights):
        for key, ms in sorted(table.items(), key=lambda kv: -kv[1])[:12]:
            print(f"{ms:8.2f} ms  {key}")


if __name__ == "__main__":
    main()
