"""ovpool's Engine against OpenVINO GenAI's LLMPipeline (or llama.cpp's, ``--peer llamacpp``; see
benchmarks/engine_vs_llamacpp.py) on the same GGUF and device.

Both sides run greedy, ignore_eos, no chat template, on the same prompt token ids.

    .venv/bin/python benchmarks/engine_vs_genai.py [--model smollm2] [--device CPU] [--peer genai]
        [--isa AVX2] [--json]

* Load time (constructor, no compiled-model cache) and peak RSS: each side in ``--repeats`` fresh
  subprocesses of its own (alternating sides), medians. ovpool's decode graph
  (ovpool.worker.graph.decode, made on demand after the constructor) is made before RSS and the
  timed rounds are taken.
* TTFT of a ``--prompt-tokens`` prompt and decode tokens/s over ``--new-tokens`` tokens (after the
  first): one paired subprocess loads both sides, warms each up once, then alternates them for
  ``--rounds`` rounds (which side goes first alternates), so background load on a shared machine
  hits both alike; the best of the rounds per side (other processes only ever slow a run down),
  and the median over rounds of the per-round ratio (column ``paired``), which cancels slow spells
  that outlast a round. The same rounds also give the CPU time of the prefill and per decoded
  token, which time spent descheduled does not inflate.

Each round uses a fresh prompt (disjoint windows of real text), so GenAI's prefix cache cannot
answer a timed prompt from an earlier one.

The prompts are this file's own source, which a model continues by copying it: with prompt lookup
(``prompt_lookup=auto``, the engine's default at f32) that copying would count as decode speed.
So ovpool runs with ``--prompt-lookup off`` by default, the figure quoted as plain decode; ``auto``
measures what a user of the default gets on such text (benchmarks/prompt_lookup.py measures
lookup itself). The output names the setting.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ovpool.bench import isa

PEERS = ("genai", "llamacpp")
METRICS = (("load_s", "load (s)", "lower"), ("ttft_s", "TTFT (s)", "lower"),
           ("decode_tps", "decode tok/s", "higher"), ("peak_rss_mb", "peak RSS (MiB)", "lower"))
WARMUP_PROMPT = [1, 2, 3, 4]
WARMUP_TOKENS = 4
CPU_METRICS = (("prefill_cpu_s", "prefill CPU (s)"), ("decode_cpu_ms", "CPU ms/token"))
# A runner generates n tokens from a prompt: (start, [each token's arrival]) as clock() pairs.
Stamp = tuple[float, float]
Runner = Callable[[list[int], int], tuple[Stamp, list[Stamp]]]


def clock() -> Stamp:
    """(wall seconds, this process's CPU seconds): CPU time does not count time spent descheduled."""
    return time.perf_counter(), time.process_time()


def prompt_ids(model: str, n: int, count: int) -> list[list[int]]:
    """``count`` prompts of ``n`` token ids: disjoint windows of this file's text (no shared prefix)."""
    from ovpool.worker.gguf.model import GGUFModel
    from ovpool.worker.text.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(GGUFModel.open(model).metadata)
    ids = tok.encode(Path(__file__).read_text(), add_special=False)
    while len(ids) < (n + 1) * count:
        ids = ids + ids
    return [ids[i * (n + 1):i * (n + 1) + n] for i in range(count)]


def load_ovpool(args: argparse.Namespace) -> tuple[float, Runner]:
    from ovpool import Engine
    from ovpool.sampling_params import SamplingParams

    t0 = time.perf_counter()
    # No compiled-model cache (the default caches now): a hit would time an import, not a load,
    # and with a cache a single stream runs the stateful graph, not the paged + decode graphs.
    engine = Engine(args.model, device=args.device, cache_dir="")
    load_s = time.perf_counter() - t0
    # Serving starts here; the timed rounds and the RSS are taken warmed up, as a serving worker is
    # (its decode graph made; GenAI sets its kernels up in the warm-up generation both sides run).
    engine.warm_up()

    def run(prompt: list[int], n: int) -> tuple[Stamp, list[Stamp]]:
        stamps = []
        start = clock()
        with engine.generation(prompt, SamplingParams(max_tokens=n, ignore_eos=True)) as gen:
            while not gen.finished:
                delta = gen.step()
                # A token whose text is held back (an incomplete character) comes with the next.
                if delta is not None:
                    stamps.extend([clock()] * (delta.index + 1 - len(stamps)))
            stamps.extend([clock()] * (len(gen.completion().token_ids) - len(stamps)))
        return start, stamps

    return load_s, run


def load_genai(args: argparse.Namespace) -> tuple[float, Runner]:
    import numpy as np
    import openvino as ov
    import openvino_genai as genai

    from ovpool.worker.gguf.model import resolve_model_path

    path = str(resolve_model_path(args.model))
    t0 = time.perf_counter()
    pipe = genai.LLMPipeline(path, args.device, **isa.peer_properties())
    load_s = time.perf_counter() - t0

    class Stamps(genai.StreamerBase):
        def __init__(self):
            super().__init__()
            self.stamps = []

        def write(self, token):
            now = clock()
            self.stamps.extend([now] * (len(token) if isinstance(token, list) else 1))
            return genai.StreamingStatus.RUNNING

        def end(self):
            pass

    def run(prompt: list[int], n: int) -> tuple[Stamp, list[Stamp]]:
        cfg = genai.GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, ignore_eos=True)
        streamer = Stamps()
        tensor = ov.Tensor(np.array([prompt], dtype=np.int64))
        start = clock()
        pipe.generate(tensor, cfg, streamer)
        return start, streamer.stamps

    return load_s, run


def load_llamacpp(args: argparse.Namespace) -> tuple[float, Runner]:
    """llama.cpp through llama-cpp-python, on every core (its default is half of them) and a
    context that holds the prompt and the generation. ``--omp-passive``: its OpenMP threads sleep
    at barriers instead of spinning (OMP_WAIT_POLICY=PASSIVE), which a CPU shared with other
    jobs rewards; set before llama.cpp's OpenMP runtime loads. On AMX its weight repacking is off
    (0.3.36's AMX matmul segfaults at the first pass; ggml-org/llama.cpp#20824)."""
    import os

    if args.omp_passive:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    import llama_cpp

    from ovpool.models import resolve_model_path

    llamacpp_without_amx_repack()
    path = str(resolve_model_path(args.model))
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=path, n_ctx=args.prompt_tokens + args.new_tokens + 64,
                          n_batch=args.prompt_tokens, n_threads=os.cpu_count(),
                          n_threads_batch=os.cpu_count(), verbose=False)
    load_s = time.perf_counter() - t0

    def run(prompt: list[int], n: int) -> tuple[Stamp, list[Stamp]]:
        stamps = []
        llm.reset()
        start = clock()
        for _ in llm.generate(prompt, top_k=1, temp=0.0, reset=True):  # never stops at EOS itself
            stamps.append(clock())
            if len(stamps) == n:
                break
        return start, stamps

    return load_s, run


def llamacpp_without_amx_repack() -> None:
    """On AMX, llama.cpp 0.3.36's AMX weight buffers (its "extra" buffer types) crash its first
    pass (SIGSEGV); its CPU kernels (8-bit activations too) run without them."""
    import llama_cpp.llama_cpp as raw

    from ovpool.worker.graph.cpu_class import CpuInfo

    if CpuInfo.read().class_name != "AMX":
        return
    defaults = raw.llama_model_default_params

    def without_repacking():
        params = defaults()
        params.use_extra_bufts = False
        return params

    raw.llama_model_default_params = without_repacking


LOADERS = {"ovpool": load_ovpool, "genai": load_genai, "llamacpp": load_llamacpp}


def sides(args: argparse.Namespace) -> tuple[str, str]:
    return "ovpool", args.peer


def timed(side: str, run: Runner, prompt: list[int], n: int) -> dict[str, float]:
    """TTFT and decode tokens/s (after the first token) of one generation, and their CPU times."""
    start, stamps = run(prompt, n)
    if len(stamps) != n:
        raise SystemExit(f"{side}: generated {len(stamps)} tokens, expected {n}")
    (first, first_cpu), (last, last_cpu) = stamps[0], stamps[-1]
    return {"ttft_s": first - start[0], "decode_tps": (n - 1) / (last - first),
            "prefill_cpu_s": first_cpu - start[1], "decode_cpu_ms": 1000 * (last_cpu - first_cpu) / (n - 1)}


def child_load(args: argparse.Namespace) -> dict:
    load_s, run = LOADERS[args.child](args)
    run(WARMUP_PROMPT, WARMUP_TOKENS)
    return {"load_s": load_s, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def child_paired(args: argparse.Namespace) -> dict:
    runners = {side: LOADERS[side](args)[1] for side in sides(args)}
    for run in runners.values():
        run(WARMUP_PROMPT, WARMUP_TOKENS)
    rounds: dict[str, list[dict[str, float]]] = {side: [] for side in sides(args)}
    for i, prompt in enumerate(json.loads(args.ids)):
        for side in sides(args)[::-1] if i % 2 else sides(args):  # neither side always runs first
            rounds[side].append(timed(side, runners[side], prompt, args.new_tokens))
    best = {key: max if key == "decode_tps" else min
            for key in ("ttft_s", "decode_tps", "prefill_cpu_s", "decode_cpu_ms")}
    return {side: {**{key: pick(r[key] for r in rs) for key, pick in best.items()}, "rounds": rs}
            for side, rs in rounds.items()}


def run_child(child: str, args: argparse.Namespace, prompts: list[list[int]] | None = None) -> dict:
    cmd = [sys.executable, __file__, "--child", child, "--model", args.model, "--device", args.device,
           "--new-tokens", str(args.new_tokens), "--prompt-tokens", str(args.prompt_tokens),
           "--peer", args.peer, "--prompt-lookup", args.prompt_lookup,
           *(["--omp-passive"] if args.omp_passive else [])]
    if prompts is not None:
        cmd += ["--ids", json.dumps(prompts)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{child} run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(loads: dict[str, list[dict]], paired: dict, peer: str) -> dict:
    med = {side: {"load_s": statistics.median(r["load_s"] for r in loads[side]),
                  "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in loads[side]),
                  **{k: v for k, v in paired[side].items() if k != "rounds"}}
           for side in ("ovpool", peer)}
    metrics = [(key, better) for key, _, better in METRICS] + [(k, "lower") for k, _ in CPU_METRICS]
    ratios = {key: _ratio(med["ovpool"][key], med[peer][key], better) for key, better in metrics}
    # Per-round ratios: the two sides of one round ran seconds apart, so slow spells of a shared
    # machine cancel out in each ratio; their median is the steadier comparison.
    rounds = zip(paired["ovpool"]["rounds"], paired[peer]["rounds"], strict=True)
    pairs = [{key: _ratio(o[key], g[key], better) for key, better in metrics if key in o} for o, g in rounds]
    paired_ratios = {key: statistics.median(p[key] for p in pairs) for key in pairs[0]}
    return {"cpu": host(), "result": med, "ratio_ovpool_better": ratios, "paired_ratio_median": paired_ratios}


def host() -> str:
    """The CPU model, its class and ISA flags, printed beside the figures."""
    import openvino as ov

    from ovpool.worker.graph.cpu_class import CpuInfo

    return isa.describe(CpuInfo.read(ov.Core()).describe())


def _ratio(ovpool: float, peer: float, better: str) -> float:
    """"ovpool is N× better", whichever direction is better for the metric."""
    return ovpool / peer if better == "higher" else peer / ovpool


def print_table(summary: dict, args: argparse.Namespace) -> None:
    print(f"cpu: {summary['cpu']}")
    print(f"model={args.model} device={args.device} prompt={args.prompt_tokens} tokens "
          f"new={args.new_tokens} repeats={args.repeats} rounds={args.rounds} "
          f"ovpool prompt_lookup={args.prompt_lookup} (ratio > 1 means ovpool is better)")
    print(f"{'metric':<16}{'ovpool':>12}{args.peer:>12}{'ratio':>9}{'paired':>9}")
    for key, label in [(k, label) for k, label, _ in METRICS] + list(CPU_METRICS):
        m, paired = summary["result"], summary["paired_ratio_median"]
        column = f"{paired[key]:>8.2f}x" if key in paired else ""
        print(f"{label:<16}{m['ovpool'][key]:>12.3f}{m[args.peer][key]:>12.3f}"
              f"{summary['ratio_ovpool_better'][key]:>8.2f}x{column}")


def parse_args(argv=None, peer: str = "genai", model: str = "smollm2") -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=model, help=f"GGUF path or alias (default {model})")
    p.add_argument("--peer", choices=PEERS, default=peer, help=f"the other engine (default {peer})")
    p.add_argument("--omp-passive", action="store_true", help="llamacpp: OMP_WAIT_POLICY=PASSIVE")
    p.add_argument("--device", default="CPU")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="load/RSS subprocesses per side (median)")
    p.add_argument("--rounds", type=int, default=8, help="alternating timed generations (best, "
                   "and the median of per-round ratios)")
    p.add_argument("--prompt-lookup", choices=("off", "auto", "on"), default="off",
                   help="ovpool's prompt_lookup (default off: plain decode; the prompts are source "
                   "text a model copies, which lookup would count as decode speed)")
    p.add_argument("--json", action="store_true", help="print every measurement and the summary")
    p.add_argument("--isa", help="genai: run both sides with AVX2 MatMul kernels on a bigger CPU "
                   "(ovpool/bench/isa.py)")
    p.add_argument("--child", choices=[*LOADERS, "paired"], help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None, peer: str = "genai", model: str = "smollm2") -> None:
    args = parse_args(argv, peer, model)
    if args.isa and args.peer != "genai":
        raise SystemExit("--isa: llama.cpp JITs nothing, its kernels are what it was built with")
    isa.emulate(args.isa)  # the children inherit it
    os.environ["OVPOOL_PROMPT_LOOKUP"] = args.prompt_lookup  # and this
    if args.child:
        print(json.dumps(child_paired(args) if args.child == "paired" else child_load(args)))
        return
    loads: dict[str, list[dict]] = {side: [] for side in sides(args)}
    for _ in range(args.repeats):
        for side in sides(args):
            loads[side].append(run_child(side, args))
    paired = run_child("paired", args, prompt_ids(args.model, args.prompt_tokens, args.rounds))
    summary = summarize(loads, paired, args.peer)
    if args.json:
        print(json.dumps({"loads": loads, "paired": paired, **summary,
                          "prompt_lookup": args.prompt_lookup}, indent=2))
    else:
        print_table(summary, args)


if __name__ == "__main__":
    main()
