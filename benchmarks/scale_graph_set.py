"""What the decode graph costs and gains at each model size, on synthetic GGUFs in real shapes.

    .venv/bin/python benchmarks/scale_graph_set.py [--sizes smollm2-135m,tinyllama-1.1b,llama3.2-3b]
        [--repeats 3] [--weight-type Q4_0] [--dir /tmp/ovpool-scale] [--json]

The decode graph (ovpool.worker.graph.decode: a second compiled copy of the paged graph, with a
second layout of the weights), per size and repeat: one fresh process with ``decode_graph=on`` and
one with ``off`` (alternating), each an Engine without a cache (the paged graph) warmed up as a
serving worker is, then a 256-token prompt and ``--new-tokens``; decode tokens/s, CPU ms per step,
and peak RSS after load, after the warm-up and at the end, beside ``decode_graph=auto``'s choice,
the RSS budget 1.15 x (weight bytes + KV budget) + 300 MiB (issue 30) and the host's read
bandwidth, measured before and after the runs. The files are benchmarks/scale_models.py's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from scale import read_bandwidth_gbs, script
from scale_models import model_file, parser, weight_bytes


def graph_set_child(path: str, decode_graph: str, new_tokens: int) -> dict:
    """One Engine (no cache: the paged graph) with ``decode_graph``, warmed up as a serving worker
    is; peak RSS after each phase, then a 256-token prompt and ``new_tokens`` decode steps."""
    from ovpool import Engine
    from ovpool.sampling_params import SamplingParams

    def peak() -> float:  # VmHWM: Linux keeps ru_maxrss across exec (the parent's 1 GiB array)
        status = Path("/proc/self/status").read_text()
        return int(status.split("VmHWM:")[1].split()[0]) / 1024

    engine = Engine(path, cache_dir="", settings={"decode_graph": decode_graph})
    rss = {"load": peak()}
    engine.warm_up()  # a worker's, once idle: it makes the decode graph where there is one
    rss["warm_up"] = peak()
    vocab = engine.hparams.vocab_size
    prompt = [5 + (i * 7919) % (vocab - 10) for i in range(256)]
    stamps = []
    with engine.generation(prompt, SamplingParams(max_tokens=new_tokens, ignore_eos=True)) as gen:
        while not gen.finished:
            gen.step()
            stamps.append((time.perf_counter(), time.process_time()))
    (wall0, cpu0), (wall1, cpu1) = stamps[0], stamps[-1]
    decode = engine.load_result.decode
    return {"decode_tps": (len(stamps) - 1) / (wall1 - wall0),
            "decode_cpu_ms": 1000 * (cpu1 - cpu0) / (len(stamps) - 1),
            "peak_rss_mb": {**rss, "end": peak()},
            "decode_graph_made": decode is not None and decode.ready() is not None}


def graph_set(name: str, path: Path, args: argparse.Namespace) -> dict:
    """decode_graph on and off at one size, alternating fresh processes, ``args.repeats`` each."""
    from ovpool.worker.graph import decode

    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for i in range(args.repeats):
        for choice in ("on", "off") if i % 2 == 0 else ("off", "on"):
            runs[choice].append(script("scale_graph_set.py", "--child", str(path), "--decode-graph", choice,
                                       "--new-tokens", str(args.new_tokens)))
    med = {c: {"decode_tps": statistics.median(r["decode_tps"] for r in rs),
               "decode_cpu_ms": statistics.median(r["decode_cpu_ms"] for r in rs),
               **{f"peak_rss_{k}_mb": statistics.median(r["peak_rss_mb"][k] for r in rs)
                  for k in ("load", "warm_up", "end")}} for c, rs in runs.items()}
    weights = weight_bytes(path)
    auto = decode.resolve("auto", "CPU", weights, decode.physical_memory())
    return {"model": name, "file_mb": path.stat().st_size / 2**20, "weights_mb": weights / 2**20,
            "auto": "on" if auto else "off", "median": med, "runs": runs,
            "rss_budget_mb": 1.15 * (weights / 2**20 + args.kv_cache_mb) + 300,
            "bound_tps_per_gbs": 1e9 / weight_bytes(path, per_token=True)}


def graph_set_table(rows: list[dict], cpu: str, bandwidth: tuple[float, float], load: str) -> str:
    lines = [f"cpu: {cpu}; read bandwidth {bandwidth[0]:.1f} GB/s before, {bandwidth[1]:.1f} after; "
             f"loadavg {load}",
             "| model | weights | decode graph | decode tok/s | CPU ms/step | peak RSS: load / warm-up / end "
             "| RSS budget | bound tok/s | auto |", "|" + "---|" * 9]
    for r in rows:
        bound = min(bandwidth) * r["bound_tps_per_gbs"]
        for choice, m in r["median"].items():
            lines.append(f"| {r['model']} | {r['weights_mb']:.0f} MiB | {choice} | {m['decode_tps']:.1f} "
                         f"| {m['decode_cpu_ms']:.1f} | {m['peak_rss_load_mb']:.0f} / "
                         f"{m['peak_rss_warm_up_mb']:.0f} / {m['peak_rss_end_mb']:.0f} MiB "
                         f"| {r['rss_budget_mb']:.0f} MiB | {bound:.1f} | {r['auto']} |")
    return "\n".join(lines)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--repeats", type=int, default=3, help="processes per choice and size")
    p.add_argument("--kv-cache-mb", type=int, default=256, help="the KV budget of the RSS bound")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--decode-graph", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(graph_set_child(args.child, args.decode_graph, args.new_tokens)))
        return
    import openvino as ov

    from ovpool.worker.graph.cpu_class import CpuInfo

    cpu, folder = CpuInfo.read(ov.Core()).describe(), Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    load, before = loadavg(), read_bandwidth_gbs()
    rows = [graph_set(n, model_file(n, args.weight_type, folder), args) for n in args.sizes.split(",")]
    bandwidth = (before, read_bandwidth_gbs())
    load += " -> " + loadavg()
    print(json.dumps({"cpu": cpu, "bandwidth_gbs": bandwidth, "loadavg": load, "rows": rows}, indent=2)
          if args.json else graph_set_table(rows, cpu, bandwidth, load))


if __name__ == "__main__":
    main()
