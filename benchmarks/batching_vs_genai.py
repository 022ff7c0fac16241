"""ovpool's batching backend vs GenAI's ContinuousBatchingPipeline in ONE process, alternating.

No broker: this isolates the batched forward passes. Besides wall-clock tokens/s it reports CPU
time per generated token (all threads of the process), which other jobs on a shared machine
disturb far less than wall time. ``--sampling temperature=0.8,top_p=0.9`` adds ovpool with those
sampling parameters to the alternation (seeded per request), to weigh sampling against greedy,
with each ovpool run's main-thread CPU time outside the forward passes per token (sampling,
detokenizing, scheduling: what sampling adds to, measurable under load where wall time is not);
``--no-genai`` leaves GenAI out. ``--side NAME=K=V,...`` adds an ovpool engine with those
settings to the alternation (e.g. ``copies_off=answer_copies=off``). ``--fresh`` gives every round
prompts of its own (the round's number in the text), so that no round finds an earlier round's
blocks in ovpool's prefix cache (GenAI's is off): requests as a server meets them.
``--peer NAME=K=V,...`` adds a GenAI CB pipeline compiled with those OpenVINO properties (e.g.
``genai_f32=INFERENCE_PRECISION_HINT=f32,KV_CACHE_PRECISION=f32,DYNAMIC_QUANTIZATION_GROUP_SIZE=0``,
GenAI at ovpool's exact numerics), to tell precision from the rest of a gap.

    .venv/bin/python benchmarks/batching_vs_genai.py [--model smollm2] [--levels 1,8,16]
        [--max-tokens 64] [--repeats 2] [--sampling K=V,...] [--side NAME=K=V,...] [--fresh]
        [--peer NAME=K=V,...]
        [--no-genai] [--isa AVX2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time

from ovpool.bench import isa, sides
from ovpool.bench.local import run_all
from ovpool.bench.peers import BatchedPipeline
from ovpool.bench.sweep import PROMPTS
from ovpool.sampling_params import SamplingParams
from ovpool.worker.backend import EngineBackend
from ovpool.worker.engine import Engine
from ovpool.worker.gguf.model import resolve_model_path
from ovpool.worker.graph.cpu_class import CpuInfo


def measure(run, n: int, max_tokens: int, host: HostTime | None = None) -> dict:
    wall, cpu = time.perf_counter(), time.process_time()
    before = host.outside_s if host else 0.0
    run(n)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    tokens = n * max_tokens
    out = {"tokens_per_s": tokens / wall, "cpu_ms_per_token": cpu / tokens * 1e3}
    if host:
        out["host_us_per_token"] = (host.outside_s - before) / tokens * 1e6
    return out


class HostTime:
    """Main-thread CPU seconds a batcher spends in its steps outside the forward pass."""

    def __init__(self, batcher):
        self.outside_s = 0.0
        step, forward = batcher.step, batcher.runner.forward

        def timed_forward(*args, **kwargs):
            start = time.thread_time()
            try:
                return forward(*args, **kwargs)
            finally:
                self.outside_s -= time.thread_time() - start

        def timed_step():
            start = time.thread_time()
            try:
                return step()
            finally:
                self.outside_s += time.thread_time() - start

        batcher.step, batcher.runner.forward = timed_step, timed_forward


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--levels", default="1,8,16")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--sampling", default="", help="e.g. temperature=0.8,top_p=0.9")
    p.add_argument("--side", type=sides.side, action="append", default=[],
                   help="NAME=K=V,... (an ovpool engine's settings)")
    p.add_argument("--peer", type=sides.named, action="append", default=[],
                   help="NAME=K=V,... (a GenAI CB pipeline's OpenVINO properties)")
    p.add_argument("--fresh", action="store_true", help="prompts of their own in every round")
    p.add_argument("--no-genai", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--isa", help="run both sides with AVX2 MatMul kernels on a bigger CPU "
                   "(ovpool/bench/isa.py)")
    args = p.parse_args()
    isa.emulate(args.isa)
    mt, levels = args.max_tokens, [int(x) for x in args.levels.split(",")]
    prompts = Prompts()
    systems, backend = _systems(args, prompts, max(*levels, 2))  # the warm-up runs 2
    for run in systems.values():
        run(2)  # warm-up
    host = HostTime(backend.runs) if args.sampling else None
    runs = []
    for r in range(args.repeats):
        for n in levels:
            prompts.round = len(runs) + 1 if args.fresh else 0
            order = list(systems) if len(runs) % 2 == 0 else list(systems)[::-1]  # who goes first
            got = {k: measure(systems[k], n, mt, host if k in ("ovpool", "ovpool_sampled") else None)
                   for k in order}
            runs.append({"concurrency": n, "repeat": r, "load": os.getloadavg()[0],
                         **{k: got[k] for k in systems}})
    cpu = isa.describe(CpuInfo.read(backend.engine.core).describe())
    if args.json:
        print(json.dumps({"cpu": cpu, "runs": runs}, indent=2))
        return
    print(f"cpu: {cpu}")
    for r in runs:
        print(_line(r))


class Prompts:
    """The prompts of a level's requests; ``round`` > 0 makes them that round's own."""

    def __init__(self):
        self.round = 0

    def __call__(self, n: int) -> list[str]:
        return [PROMPTS[i % len(PROMPTS)] + (f" ({self.round})" if self.round else "") for i in range(n)]


def _systems(args, prompts: Prompts, slots: int) -> tuple[dict, EngineBackend]:
    """The sides to alternate (name -> run(n)) and the default ovpool side's backend."""
    mt = args.max_tokens

    def ovpool(backend, **sampling):
        return lambda n: run_all(backend, {str(i): (prompt, SamplingParams(
            max_tokens=mt, ignore_eos=True, seed=i, **sampling)) for i, prompt in enumerate(prompts(n))})

    backend = _backend(args.model, {}, slots)
    systems = {"ovpool": ovpool(backend)}
    if args.sampling:
        pairs = (kv.split("=") for kv in args.sampling.split(","))
        systems["ovpool_sampled"] = ovpool(backend, **{k: float(v) if "." in v else int(v) for k, v in pairs})
    for one in args.side:
        systems[one.name] = ovpool(_backend(args.model, one.settings, slots))
    if not args.no_genai:
        genai = BatchedPipeline(str(resolve_model_path(args.model)), properties=isa.peer_properties())
        systems["genai_cb"] = lambda n: genai.level(n, mt, prompts(n))
    for peer in args.peer:
        name, properties = peer.name, peer.settings
        pipe = BatchedPipeline(str(resolve_model_path(args.model)), properties={**isa.peer_properties(),
                                                                                 **properties})
        systems[name] = lambda n, pipe=pipe: pipe.level(n, mt, prompts(n))
    return systems, backend


def _backend(model: str, settings: dict, slots: int) -> EngineBackend:
    """A batching backend on an engine that is built, as GenAI builds (no cache hit)."""
    backend = EngineBackend(Engine(model, cache_dir="", settings=settings), slots=slots)
    backend.wait_batching()
    return backend


def _line(r: dict) -> str:
    o = r["ovpool"]
    line = f"N={r['concurrency']:>2} load {r['load']:4.1f}  ovpool {o['tokens_per_s']:6.1f} tok/s " \
        f"{o['cpu_ms_per_token']:5.2f} cpu-ms/token"
    if "ovpool_sampled" in r:
        s = r["ovpool_sampled"]
        line += (f" | sampled {s['tokens_per_s']:6.1f} tok/s {s['cpu_ms_per_token']:5.2f} cpu-ms/token"
                 f" | sampled/greedy {s['tokens_per_s'] / o['tokens_per_s']:.3f} tok/s,"
                 f" {o['cpu_ms_per_token'] / s['cpu_ms_per_token']:.3f} CPU | outside the forward pass"
                 f" {o['host_us_per_token']:.0f} / {s['host_us_per_token']:.0f} us/token")
    for name, side in r.items():
        if isinstance(side, dict) and name not in ("ovpool", "ovpool_sampled", "genai_cb"):
            ms = side["cpu_ms_per_token"]
            line += (f" | {name} {side['tokens_per_s']:6.1f} tok/s {ms:5.2f} cpu-ms/token,"
                     f" {name}/ovpool CPU {ms / o['cpu_ms_per_token']:.2f}")
    if "genai_cb" in r:
        g = r["genai_cb"]
        line += (f" | GenAI CB {g['tokens_per_s']:6.1f} tok/s {g['cpu_ms_per_token']:5.2f} cpu-ms/token"
                 f" | GenAI/ovpool CPU {g['cpu_ms_per_token'] / o['cpu_ms_per_token']:.2f}")
    return line


if __name__ == "__main__":
    main()
