"""How ovpool's costs grow with model size, beside OpenVINO GenAI, on synthetic GGUFs in real shapes.

    .venv/bin/python benchmarks/scale.py [--sizes smollm2-360m,qwen2.5-0.5b,tinyllama-1.1b]
        [--weight-type Q4_0] [--dir /tmp/ovpool-scale] [--plot scale.png] [--json]

Each size is a file benchmarks/scale_models.py writes once into ``--dir`` (random weights, the
shapes of the real model, a small vocabulary). Per size, in subprocesses:
``benchmarks/cache_startup.py`` (start to first token without a cache, from a cache hit, and
GenAI's) and ``benchmarks/engine_vs_genai.py`` (peak RSS, TTFT, decode tokens/s, alternating
sides). The decode bound is this host's memory read bandwidth (NumPy summing a 1 GiB array) over
the bytes of weights read per token (the file's tensors but the token embedding, which is looked
up, not read whole).

What the decode graph costs and gains at each size: benchmarks/scale_graph_set.py; llama.cpp (CPU)
and llama.cpp's OpenVINO backend beside GenAI, a fresh process per side and measurement:
benchmarks/scale_peers.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from scale_models import model_file, parameters, parser, weight_bytes

_HERE = Path(__file__).parent


def read_bandwidth_gbs() -> float:
    """Bytes per second NumPy reads summing a 1 GiB array (best of 3), as GB/s."""
    a = np.ones(1 << 27, np.float64)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - start)
    return a.nbytes / best / 1e9


def script(name: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, str(_HERE / name), *args, "--json"], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{name} {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout[proc.stdout.index("{"):])


def measure(name: str, path: Path, bandwidth: float, args: argparse.Namespace) -> dict:
    startup = script("cache_startup.py", "--model", str(path), "--repeats", "1")["median"]
    engine = script("engine_vs_genai.py", "--model", str(path), "--repeats", "1",
                    "--rounds", str(args.rounds), "--prompt-tokens", "256",
                    "--new-tokens", str(args.new_tokens))
    per_token = weight_bytes(path, per_token=True)
    params = parameters(name)
    cold, hit = startup["no cache"]["start_to_first_token_s"], startup["hit"]["start_to_first_token_s"]
    o, g = engine["result"]["ovpool"], engine["result"]["genai"]
    return {"model": name, "params_m": round(params / 1e6), "file_mb": round(path.stat().st_size / 2**20),
            "cold_start_s": cold, "hit_start_s": hit, "hit_share": hit / cold,
            "genai_start_s": startup.get("genai", {}).get("start_to_first_token_s"),
            "peak_rss_mb": o["peak_rss_mb"], "genai_peak_rss_mb": g["peak_rss_mb"],
            "ttft_s": o["ttft_s"], "genai_ttft_s": g["ttft_s"],
            "decode_tps": o["decode_tps"], "genai_decode_tps": g["decode_tps"],
            "decode_paired": engine["paired_ratio_median"]["decode_tps"],
            "bound_tps": bandwidth * 1e9 / per_token}


def table(rows: list[dict], cpu: str, bandwidth: float) -> str:
    lines = [f"cpu: {cpu}; read bandwidth {bandwidth:.1f} GB/s",
             "| model | params | cold start | hit start (share) | GenAI start | peak RSS (GenAI) "
             "| TTFT (GenAI) | decode tok/s (GenAI, paired ratio) | bound tok/s |", "|" + "---|" * 9]
    for r in rows:
        lines.append(f"| {r['model']} | {r['params_m']}M | {r['cold_start_s']:.2f} s "
                     f"| {r['hit_start_s']:.2f} s ({r['hit_share']:.2f}) | {r['genai_start_s'] or 0:.2f} s "
                     f"| {r['peak_rss_mb']:.0f} "
                     f"({r['genai_peak_rss_mb']:.0f}) MiB | {r['ttft_s']:.2f} ({r['genai_ttft_s']:.2f}) s | "
                     f"{r['decode_tps']:.1f} ({r['genai_decode_tps']:.1f}, {r['decode_paired']:.2f}x) | "
                     f"{r['bound_tps']:.0f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: str, cpu: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["params_m"] for r in rows]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    pairs = [("start to first token (s)", ("cold_start_s", "hit_start_s", "genai_start_s")),
             ("peak RSS (MiB)", ("peak_rss_mb", "genai_peak_rss_mb")),
             ("TTFT (s)", ("ttft_s", "genai_ttft_s")),
             ("decode tokens/s", ("decode_tps", "genai_decode_tps", "bound_tps"))]
    for ax, (label, keys) in zip(axes, pairs, strict=True):
        for key in keys:
            ax.plot(x, [r[key] or 0 for r in rows], "o-", label=key)
        ax.set(xlabel="parameters (M)", ylabel=label)
        ax.legend(fontsize=7)
    fig.suptitle(cpu, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--plot", help="write a PNG of each cost against parameter count")
    args = p.parse_args()
    import openvino as ov

    from ovpool.worker.graph.cpu_class import CpuInfo

    cpu, folder = CpuInfo.read(ov.Core()).describe(), Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    bandwidth = read_bandwidth_gbs()
    rows = [measure(n, model_file(n, args.weight_type, folder), bandwidth, args)
            for n in args.sizes.split(",")]
    print(json.dumps({"cpu": cpu, "bandwidth_gbs": bandwidth, "rows": rows}, indent=2) if args.json
          else table(rows, cpu, bandwidth))
    if args.plot:
        plot(rows, args.plot, cpu)


if __name__ == "__main__":
    main()
