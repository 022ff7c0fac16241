"""Where a batched decode pass goes, and what a graph setting changes in it: n sequences' one-token
steps in one paged-graph pass, the CPU plugin's per-node times (PERF_COUNT) summed by node type and
by weight (the output projection included, which ``prefill_bound.py``'s layer MatMuls leave out).

    .venv/bin/python benchmarks/batch_profile.py [--model smollm2] [--rows 8,16] [--rounds 5]
        [--passes 8] [--side NAME=K=V,K=V ...] [--static] [--bounded] [--alone]

Each ``--side`` is an engine's paged graph with those settings (default: one side at the
defaults), compiled with PERF_COUNT, the decode graph off. Per row count n: n sequences at contexts
spread over 12-135 (the positions of ``batching_vs_genai.py``'s requests at 128 tokens), each pass
one token per sequence; per round every side runs ``--passes`` passes from the same contexts, the
sides' order alternating. Per side: the median over rounds of the process's CPU ms and wall ms a
pass, the median of the per-round CPU ratios against the first side, and each node kind's and
weight's share of the summed node times (the plugin's real time per node) as CPU ms. The output
names the CPU class and load. ``--static`` adds to each side NAME/static: the same graph with its
token dimensions fixed to the n rows (as the decode graph fixes them to one), on the same KV blocks,
and says whether its logits equal the dynamic graph's; ``--bounded`` adds NAME/bounded likewise:
the token dimensions bounded (ov.Dimension(1, prefill_chunk), 1-64 sequences) instead of -1, which
the CPU plugin could plan memory and kernels for as for static ones. ``--alone``: how far the first sequence's
logits in a pass of 2..n sequences are from the same step alone (max absolute difference).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import time
from collections import defaultdict

import numpy as np
import openvino as ov
from decode_profile import name_matmuls

from ovpool.bench import sides
from ovpool.worker.generate.batch import PagedRunner
from ovpool.worker.generate.plan import Chunk
from ovpool.worker.graph.compile_settings import compile_config
from ovpool.worker.graph.cpu_class import CpuInfo

LOW, HIGH = 12, 135


def engine(model: str, settings: dict):
    """An Engine whose paged graph is compiled with PERF_COUNT and its MatMuls named by weight,
    and that graph as built (ov.Model)."""
    from ovpool.cache import loader
    from ovpool.worker.graph import loading

    compile_model, build = loader.compile_model, loading.graph.build_model

    built = []

    def named(gguf, *args, **kwargs):
        built.append(build(gguf, *args, **kwargs))
        name_matmuls(built[-1], gguf)
        return built[-1]

    loader.compile_model = lambda core, m, device, config: compile_model(core, m, device,
                                                                         {**config, "PERF_COUNT": True})
    loading.graph.build_model = named
    from ovpool import Engine

    try:
        return Engine(model, cache_dir="", settings={"decode_graph": "off", **settings}), built[-1]
    finally:
        loader.compile_model, loading.graph.build_model = compile_model, build


class Passes:
    """``rows`` sequences on one compiled paged graph, prefilled to their contexts."""

    def __init__(self, compiled, rows: int, passes: int):
        self.runner = PagedRunner(compiled, num_blocks=1)
        per = -(-(HIGH + passes + 1) // self.runner.block_size)
        self.runner.grow(rows * per)
        self.blocks = [list(range(i * per, (i + 1) * per)) for i in range(rows)]
        self.starts = [LOW + (HIGH - LOW) * i // max(rows - 1, 1) for i in range(rows)]
        self.passes = passes
        for i, start in enumerate(self.starts):
            self.runner.forward([Chunk(str(i), 0, list(range(100, 100 + start)), self.blocks[i], True)])

    def run_on(self, compiled) -> None:
        """Run the next passes on ``compiled`` (a static-row copy of the graph), on these blocks."""
        self.runner.requests[0] = self.runner.request_on(compiled)

    def logits(self, rows: int) -> np.ndarray:
        """The first ``rows`` sequences' next step (not advancing them), their logits."""
        chunks = [Chunk(str(i), s, [200 + i], self.blocks[i], True) for i, s in enumerate(self.starts[:rows])]
        return self.runner.forward(chunks).copy()

    def round(self) -> tuple[float, float, dict, dict]:
        """CPU and wall ms a pass, and node CPU ms a pass by kind and by weight."""
        cpu = wall = 0.0
        kinds, weights = defaultdict(float), defaultdict(float)
        for step in range(self.passes):
            chunks = [Chunk(str(i), s + step, [200 + i], self.blocks[i], True)
                      for i, s in enumerate(self.starts)]
            w, c = time.perf_counter(), time.process_time()
            self.runner.forward(chunks)
            w, c = time.perf_counter() - w, time.process_time() - c
            cpu, wall = cpu + c, wall + w
            nodes = [(n.node_type, n.exec_type, n.node_name, n.real_time.total_seconds())
                     for n in self.runner.requests[0].profiling_info]
            total = sum(n[3] for n in nodes)
            for kind, exec_type, name, seconds in nodes:
                ms = seconds / total * c * 1e3 / self.passes
                kinds[f"{kind} ({exec_type})"] += ms
                if ":" in name:
                    weights[re.sub(r"_\d+$", "", re.sub(r"blk\.\d+\.", "", name))] += ms
        return cpu * 1e3 / self.passes, wall * 1e3 / self.passes, kinds, weights


def compare(runs: dict[str, Passes], rounds: int) -> dict[str, dict]:
    """Per side: median CPU and wall ms a pass, CPU ratio to the first side, nodes (medians)."""
    got: dict[str, list] = {side: [] for side in runs}
    for r in range(rounds):
        for side in list(runs)[::-1] if r % 2 else list(runs):
            got[side].append(runs[side].round())
    first, med = next(iter(got)), statistics.median
    out = {}
    for side, rs in got.items():
        kinds = {k: med(r[2].get(k, 0.0) for r in rs) for k in rs[0][2]}
        weights = {k: med(r[3].get(k, 0.0) for r in rs) for k in rs[0][3]}
        ratio = med(a[0] / b[0] for a, b in zip(got[first], rs, strict=True))
        out[side] = {"cpu_ms": med(r[0] for r in rs), "wall_ms": med(r[1] for r in rs),
                     "first_over_this": ratio, "kinds": kinds, "weights": weights}
    return out


def twin(e, graph: ov.Model, rows: int, kind: str) -> ov.CompiledModel:
    """``graph`` with its token dimensions fixed to ``rows`` sequences of one token each (``static``),
    or bounded by the prefill chunk and 64 sequences (``bounded``: ov.Dimension(1, n) for -1),
    compiled as the engine's paged graph was."""
    graph = graph.clone()
    if kind == "static":
        tokens, sequences, offsets = ov.Dimension(rows), ov.Dimension(rows), ov.Dimension(rows + 1)
    else:
        tokens = ov.Dimension(1, e.config.prefill_chunk)
        sequences, offsets = ov.Dimension(1, 64), ov.Dimension(2, 65)
    shapes = {"input_ids": [1, tokens], "position_ids": [1, tokens], "past_lens": [sequences],
              "subsequence_begins": [offsets], "block_indices_begins": [offsets], "logits_indices": [tokens]}
    graph.reshape({graph.input(name): ov.PartialShape(shape) for name, shape in shapes.items()})
    config = compile_config(e.graph_settings, "CPU", e.core)  # weight groups: int8 activations only
    return e.core.compile_model(graph, "CPU", {**config, "PERF_COUNT": True})


def sides_for(engines: dict, rows: int, passes: int, twins: list[str]) -> dict[str, Passes]:
    """Each side's Passes, and for each of ``twins`` (static, bounded) its twin graph's (whose
    logits are checked against the dynamic graph's)."""
    runs = {}
    for name, (e, graph) in engines.items():
        runs[name] = Passes(e.paged_graph().compiled, rows, passes)
        for kind in twins:
            other = runs[f"{name}/{kind}"] = Passes(e.paged_graph().compiled, rows, passes)
            other.run_on(twin(e, graph, rows, kind))
            same = np.array_equal(runs[name].logits(rows), other.logits(rows))
            print(f"{name}/{kind}, {rows} rows: logits {'equal to' if same else 'unlike'} the dynamic "
                  "graph's")
    return runs


def alone(passes: Passes, rows: int) -> str:
    """The first sequence's logits in passes of 2..``rows`` sequences against its step alone."""
    first = passes.logits(1)[0]
    return " ".join(f"{n}: {np.abs(passes.logits(n)[0] - first).max():.1e}" for n in range(2, rows + 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--rows", default="8,16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--passes", type=int, default=8)
    ap.add_argument("--side", type=sides.side, action="append", default=[],
                    help="NAME=K=V,K=V (settings of one side)")
    ap.add_argument("--static", action="store_true", help="each side's static-row twin beside it")
    ap.add_argument("--bounded", action="store_true", help="each side's bounded-dimension twin beside it")
    ap.add_argument("--alone", action="store_true", help="a row batched against alone")
    args = ap.parse_args()
    engines = {s.name: engine(args.model, s.settings) for s in args.side or [sides.side("default=")]}
    first = next(iter(engines.values()))[0]
    print(f"cpu: {CpuInfo.read(first.core).describe()}")
    for name, (e, _) in engines.items():
        print(f"{name}: {e.graph_settings}")
    for rows in (int(r) for r in args.rows.split(",")):
        twins = [k for k in ("static", "bounded") if getattr(args, k)]
        runs = sides_for(engines, rows, args.passes, twins)
        if args.alone:
            for name in engines:
                print(f"{name}, {rows} rows, first row batched - alone: {alone(runs[name], rows)}")
        report(rows, compare(runs, args.rounds), args)


def report(rows: int, result: dict, args) -> None:
    print(f"\n{rows} rows, {args.rounds} rounds of {args.passes} passes, load {os.getloadavg()[0]:.1f}")
    for name, p in result.items():
        print(f"{name}: CPU {p['cpu_ms']:.1f} ms a pass, wall {p['wall_ms']:.1f} ms, "
              f"first side's CPU / this {p['first_over_this']:.3f}")
        for table in ("kinds", "weights"):
            for key, ms in sorted(p[table].items(), key=lambda kv: -kv[1])[:8]:
                print(f"  {ms:7.2f} ms {100 * ms / p['cpu_ms']:5.1f}%  {key}")


if __name__ == "__main__":
    main()
