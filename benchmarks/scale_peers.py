"""ovpool beside OpenVINO GenAI, llama.cpp (CPU) and llama.cpp's OpenVINO backend at each model
size, on synthetic GGUFs in real shapes: decode tokens/s, TTFT, peak RSS, and decode as a share of
the memory-bandwidth bound.

    .venv/bin/python benchmarks/scale_peers.py [--sizes smollm2-135m,tinyllama-1.1b,llama3.2-3b]
        [--weight-type Q4_0|Q4_K_M] [--peers genai,llamacpp,llamacpp-ov] [--repeats 3]
        [--prompt-tokens 256] [--new-tokens 48] [--plot docs/scale-peers.png] [--json]

The files are benchmarks/scale_models.py's (random weights, the real shapes, a small vocabulary with
its tokenizer, which the peers read as they read a real file's); a size not in its ``SHAPES`` is a
real model, a path or an alias (``--sizes smollm2``). Per size and repeat, one
fresh process per side, back to back, the order rotating each repeat: load (no compiled-model
cache), a 4-token warm-up generation (ovpool's ``Engine.warm_up()`` too, as a serving worker), then
one timed generation, greedy, ignore_eos, of ``--prompt-tokens`` tokens of real text (a different
window each repeat, the same for every side) and ``--new-tokens`` tokens; peak RSS is that
process's VmHWM. The loaders are benchmarks/engine_vs_genai.py's; ``llamacpp-ov`` (and
``llamacpp-ov-stateful``) is benchmarks/llamacpp_openvino.py's ``llama-server`` (built apart, see
there), timed per streamed token from this child, its load the server's start until it answers,
its CPU time and VmHWM the server process's. ovpool runs with ``prompt_lookup=off``: random
weights repeat themselves, which lookup would turn into speed that is no decode speed
(benchmarks/prompt_lookup.py measures lookup). llama.cpp's OpenMP threads sleep at barriers
(OMP_WAIT_POLICY=PASSIVE; ``--omp-spin``: its default): on a CPU shared with other jobs its
spinning threads lose whole time slices (SmolLM2's shape at a load of 4-5 on 2 cores: 3-9 tok/s
spinning against ~20 for the OpenVINO sides).

Per repeat, ovpool over each peer (``ratio > 1``: ovpool better), processes seconds apart; the
median of those ratios. The bound: this host's read bandwidth (NumPy summing 1 GiB, one thread,
best of 3; measured before each repeat, the median used) over the weight bytes a decode step reads
(all but the token embedding); ``of bound`` is decode tok/s over it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from llamacpp_openvino import Server, binary, vmhwm_mb
from scale import read_bandwidth_gbs, script
from scale_graph_set import loadavg
from scale_models import model_file, parameters, parser, weight_bytes

SIDES = ("ovpool", "genai", "llamacpp", "llamacpp-ov", "llamacpp-ov-stateful")
METRICS = {"decode_tps": "higher", "decode_cpu_ms": "lower", "ttft_s": "lower", "peak_rss_mb": "lower",
           "load_s": "lower"}


def child(side: str, path: str, prompt: list[int], new_tokens: int, omp_passive: bool) -> dict:
    """One side in this fresh process: load, warm up, one timed generation; its peak RSS."""
    from engine_vs_genai import WARMUP_PROMPT, WARMUP_TOKENS, timed

    args = argparse.Namespace(model=path, device="CPU", prompt_tokens=len(prompt), new_tokens=new_tokens,
                              omp_passive=omp_passive)
    with loaded(side, args) as (load_s, run, peak_rss_mb):
        run(WARMUP_PROMPT, WARMUP_TOKENS)
        result = timed(side, run, prompt, new_tokens)
        return {"load_s": load_s, "ttft_s": result["ttft_s"], "decode_tps": result["decode_tps"],
                "decode_cpu_ms": result["decode_cpu_ms"], "peak_rss_mb": peak_rss_mb()}


@contextmanager
def loaded(side: str, args: argparse.Namespace):
    """(load seconds, its runner, its peak RSS in MiB): in this process, or llama-server's."""
    if side.startswith("llamacpp-ov"):
        if args.omp_passive:  # its ggml threads (OpenMP) sleep at barriers, as llama.cpp's do here
            os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        context = args.prompt_tokens + args.new_tokens + 64
        with tempfile.TemporaryDirectory() as work, Server(args.model, context, Path(work),
                                                         side.endswith("stateful")) as server:
            yield server.ready_s, server.run, server.peak_rss_mb
        return
    from engine_vs_genai import LOADERS

    os.environ["OVPOOL_PROMPT_LOOKUP"] = "off"
    load_s, run = LOADERS[side](args)
    yield load_s, run, lambda: vmhwm_mb("self")


def measure(name: str, path: Path, sides: list[str], args: argparse.Namespace) -> dict:
    """``args.repeats`` rounds of one fresh process per side, the order rotating; medians, the
    median per-round ratios of ovpool over each peer, and the bound."""
    from engine_vs_genai import prompt_ids

    prompts = prompt_ids(str(path), args.prompt_tokens, args.repeats)
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    bandwidth = []
    for i, prompt in enumerate(prompts):
        bandwidth.append(read_bandwidth_gbs())
        for side in sides[i % len(sides):] + sides[:i % len(sides)]:
            runs[side].append(script("scale_peers.py", "--child", side, "--model", str(path),
                                     "--ids", json.dumps(prompt), "--new-tokens", str(args.new_tokens),
                                     *(["--omp-spin"] if args.omp_spin else [])))
            print(f"# {name} {i} {side} {runs[side][-1]} load {loadavg()}", file=sys.stderr, flush=True)
    median = {s: {k: statistics.median(r[k] for r in rs) for k in METRICS}
              for s, rs in runs.items()}
    paired = {peer: {k: statistics.median(_ratio(o[k], p[k], better)
                                          for o, p in zip(runs["ovpool"], runs[peer], strict=True))
                     for k, better in METRICS.items()} for peer in sides[1:]}
    bound = statistics.median(bandwidth) * 1e9 / weight_bytes(path, per_token=True)
    return {"model": path.stem, "params_m": round(parameters(name, path) / 1e6),
            "weights_mb": weight_bytes(path) / 2**20, "bandwidth_gbs": bandwidth, "bound_tps": bound,
            "median": median, "paired": paired, "runs": runs,
            "of_bound": {s: m["decode_tps"] / bound for s, m in median.items()}}


def _ratio(ovpool: float, peer: float, better: str) -> float:
    return ovpool / peer if better == "higher" else peer / ovpool


def table(rows: list[dict], cpu: str, load: str) -> str:
    lines = [f"cpu: {cpu}; loadavg {load}",
             "| model | weights | side | decode tok/s (of bound) | CPU ms/token | TTFT | peak RSS | load "
             "| ovpool's paired ratio decode / CPU per token / TTFT / RSS |", "|" + "---|" * 9]
    for r in rows:
        for side, m in r["median"].items():
            ratio = r["paired"].get(side)
            paired = " / ".join(f"{ratio[k]:.2f}x" for k in ("decode_tps", "decode_cpu_ms", "ttft_s",
                                                            "peak_rss_mb")) if ratio else ""
            lines.append(f"| {r['model']} | {r['weights_mb']:.0f} MiB | {side} | {m['decode_tps']:.2f} "
                         f"({r['of_bound'][side]:.2f}) | {m['decode_cpu_ms']:.0f} | {m['ttft_s']:.2f} s "
                         f"| {m['peak_rss_mb']:.0f} MiB | {m['load_s']:.1f} s | {paired} |")
        lines.append(f"| {r['model']} | | bound | {r['bound_tps']:.2f} (read "
                     f"{statistics.median(r['bandwidth_gbs']):.1f} GB/s) | | | | | |")
    return "\n".join(lines)


def plot(rows: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["params_m"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, key, label in zip(axes, ("decode_tps", "ttft_s", "peak_rss_mb"),
                              ("decode tokens/s", "TTFT (s)", "peak RSS (MiB)"), strict=True):
        for side in rows[0]["median"]:
            ax.plot(x, [r["median"][side][key] for r in rows], "o-", label=side)
        if key == "decode_tps":
            ax.plot(x, [r["bound_tps"] for r in rows], "k--", label="bandwidth bound")
        ax.set(xlabel="parameters (M)", ylabel=label, xscale="log", yscale="log")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    p = parser(__doc__)
    p.set_defaults(sizes="smollm2-135m,tinyllama-1.1b,llama3.2-3b")
    p.add_argument("--peers", default="genai,llamacpp", help="of: genai, llamacpp, llamacpp-ov, "
                   "llamacpp-ov-stateful (llama.cpp's OpenVINO backend, built apart, at its default "
                   "and with its KV cache as state: benchmarks/llamacpp_openvino.py)")
    p.add_argument("--repeats", type=int, default=3, help="processes per side and size")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--omp-spin", action="store_true", help="llama.cpp's OpenMP threads spin at "
                   "barriers (its default; by default here they sleep, OMP_WAIT_POLICY=PASSIVE)")
    p.add_argument("--plot", help="write a PNG of each figure against parameter count")
    p.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.model, json.loads(args.ids), args.new_tokens,
                               not args.omp_spin)))
        return
    sides = ["ovpool", *args.peers.split(",")]
    if unknown := set(sides) - set(SIDES):
        raise SystemExit(f"--peers: unknown {', '.join(sorted(unknown))} (of {', '.join(SIDES[1:])})")
    if any(s.startswith("llamacpp-ov") for s in sides):
        binary("llama-server")  # not built: stop now, with the build command
    from engine_vs_genai import host

    cpu, folder, load = host(), Path(args.dir), loadavg()
    folder.mkdir(parents=True, exist_ok=True)
    rows = [measure(n, model_file(n, args.weight_type, folder), sides, args) for n in args.sizes.split(",")]
    load += " -> " + loadavg()
    print(json.dumps({"cpu": cpu, "loadavg": load, "rows": rows}, indent=2) if args.json
          else table(rows, cpu, load))
    if args.plot:
        plot(rows, args.plot, f"{cpu}; loadavg {load}")


if __name__ == "__main__":
    main()
