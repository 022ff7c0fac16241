"""ovpool's Engine against OpenVINO GenAI's LLMPipeline on the same GGUF and device.

Both sides run greedy, ignore_eos, no chat template, on the same prompt token ids. Each run is a
fresh subprocess, so load time has no cache behind it and peak RSS belongs to one side only; every
side runs ``--repeats`` times and the table shows medians.

    .venv/bin/python benchmarks/engine_vs_genai.py [--model smollm2] [--device CPU] [--json]

Measured per run: load (constructor, no compiled-model cache), TTFT of a ``--prompt-tokens`` prompt
(after one short warm-up generation, as a server would have), decode tokens/s over
``--new-tokens`` tokens (after the first), and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIDES = ("ovpool", "genai")
METRICS = (("load_s", "load (s)", "lower"), ("ttft_s", "TTFT (s)", "lower"),
           ("decode_tps", "decode tok/s", "higher"), ("peak_rss_mb", "peak RSS (MiB)", "lower"))
WARMUP_PROMPT = (1, 2, 3, 4)
WARMUP_TOKENS = 4


def prompt_ids(model: str, n: int) -> list[int]:
    """``n`` token ids of real text (this file), the same for both sides."""
    from ovpool.worker.model import GGUFModel
    from ovpool.worker.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(GGUFModel.open(model).metadata)
    ids = tok.encode(Path(__file__).read_text(), add_special=False)
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rates(start: float, stamps: list[float]) -> tuple[float, float]:
    """TTFT from ``start`` to the first token, and tokens/s over the tokens after it."""
    decode_s = stamps[-1] - stamps[0]
    return stamps[0] - start, (len(stamps) - 1) / decode_s


def child_ovpool(args: argparse.Namespace, ids: list[int]) -> dict:
    from ovpool import Engine
    from ovpool.worker.sampling import SamplingParams

    t0 = time.perf_counter()
    engine = Engine(args.model, device=args.device)
    load_s = time.perf_counter() - t0

    def run(prompt, n):
        params = SamplingParams(max_tokens=n, ignore_eos=True)
        stamps = []
        start = time.perf_counter()
        with engine.generation(list(prompt), params) as gen:
            while not gen.finished:
                gen.step()
                stamps.append(time.perf_counter())
        return start, stamps

    run(WARMUP_PROMPT, WARMUP_TOKENS)
    start, stamps = run(ids, args.new_tokens)
    return {"load_s": load_s, "load_report": engine.load_report, "stamps": (start, stamps)}


def child_genai(args: argparse.Namespace, ids: list[int]) -> dict:
    import numpy as np
    import openvino as ov
    import openvino_genai as genai

    from ovpool.worker.model import resolve_model_path

    path = str(resolve_model_path(args.model))
    t0 = time.perf_counter()
    pipe = genai.LLMPipeline(path, args.device)
    load_s = time.perf_counter() - t0

    class Stamps(genai.StreamerBase):
        def __init__(self):
            super().__init__()
            self.stamps = []

        def write(self, token):
            now = time.perf_counter()
            self.stamps.extend([now] * (len(token) if isinstance(token, list) else 1))
            return genai.StreamingStatus.RUNNING

        def end(self):
            pass

    def run(prompt, n):
        cfg = genai.GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, ignore_eos=True)
        streamer = Stamps()
        tensor = ov.Tensor(np.array([prompt], dtype=np.int64))
        start = time.perf_counter()
        pipe.generate(tensor, cfg, streamer)
        return start, streamer.stamps

    run(WARMUP_PROMPT, WARMUP_TOKENS)
    start, stamps = run(ids, args.new_tokens)
    return {"load_s": load_s, "stamps": (start, stamps)}


def child_main(args: argparse.Namespace) -> None:
    ids = json.loads(args.ids)
    out = (child_ovpool if args.child == "ovpool" else child_genai)(args, ids)
    start, stamps = out.pop("stamps")
    if len(stamps) != args.new_tokens:
        raise SystemExit(f"{args.child}: generated {len(stamps)} tokens, expected {args.new_tokens}")
    out["ttft_s"], out["decode_tps"] = _rates(start, stamps)
    out["peak_rss_mb"] = _peak_rss_mb()
    print(json.dumps(out, default=str))


def run_child(side: str, args: argparse.Namespace, ids: list[int]) -> dict:
    cmd = [sys.executable, __file__, "--child", side, "--ids", json.dumps(ids), "--model", args.model,
           "--device", args.device, "--new-tokens", str(args.new_tokens)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{side} run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(runs: dict[str, list[dict]]) -> dict:
    med = {side: {key: statistics.median(r[key] for r in rs) for key, _, _ in METRICS}
           for side, rs in runs.items()}
    # Ratios read as "ovpool is N× better" whichever direction is better for the metric.
    ratios = {}
    for key, _, better in METRICS:
        a, b = med["ovpool"][key], med["genai"][key]
        ratios[key] = a / b if better == "higher" else b / a
    return {"median": med, "ratio_ovpool_better": ratios}


def print_table(summary: dict, args: argparse.Namespace, n_prompt: int) -> None:
    print(f"model={args.model} device={args.device} prompt={n_prompt} tokens new={args.new_tokens} "
          f"repeats={args.repeats} (medians; ratio > 1 means ovpool is better)")
    print(f"{'metric':<16}{'ovpool':>12}{'genai':>12}{'ratio':>9}")
    for key, label, _ in METRICS:
        m = summary["median"]
        print(f"{label:<16}{m['ovpool'][key]:>12.3f}{m['genai'][key]:>12.3f}"
              f"{summary['ratio_ovpool_better'][key]:>8.2f}x")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="GGUF path or alias (default smollm2)")
    p.add_argument("--device", default="CPU")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="fresh processes per side (median taken)")
    p.add_argument("--sides", default=",".join(SIDES), help="comma-separated subset of ovpool,genai")
    p.add_argument("--json", action="store_true", help="print the raw runs and summary as JSON")
    p.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.child:
        child_main(args)
        return
    ids = prompt_ids(args.model, args.prompt_tokens)
    sides = [s for s in args.sides.split(",") if s]
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    for _ in range(args.repeats):
        for side in sides:  # alternate sides so background load hits both alike
            runs[side].append(run_child(side, args, ids))
    if set(sides) != set(SIDES):
        print(json.dumps(runs, indent=2, default=str))
        return
    summary = summarize(runs)
    if args.json:
        print(json.dumps({"runs": runs, **summary}, indent=2, default=str))
    else:
        print_table(summary, args, len(ids))


if __name__ == "__main__":
    main()
