"""How ovpool's costs grow with model size, beside OpenVINO GenAI, on synthetic GGUFs in real shapes.

    .venv/bin/python benchmarks/scale.py [--sizes smollm2-360m,qwen2.5-0.5b,tinyllama-1.1b]
        [--weight-type Q4_0] [--dir /tmp/ovpool-scale] [--plot scale.png] [--json]

Each size is a file ``ovpool.testing.tiny`` writes once into ``--dir`` (random weights, the shapes of
the real model, a small vocabulary). Per size, in subprocesses: ``benchmarks/cache_startup.py``
(start to first token without a cache, from a cache hit, and GenAI's) and
``benchmarks/engine_vs_genai.py`` (peak RSS, TTFT, decode tokens/s, alternating sides). The decode
bound is this host's memory read bandwidth (NumPy summing a 1 GiB array) over the bytes of weights
read per token (the file's tensors but the token embedding, which is looked up, not read whole).

    .venv/bin/python benchmarks/scale.py --graph-set [--sizes smollm2-135m,tinyllama-1.1b,llama3.2-3b]
        [--repeats 3]

``--graph-set`` measures what the decode graph (ovpool.worker.graph.decode: a second compiled copy
of the paged graph, with a second layout of the weights) costs and gains at each size: per size and
repeat, one fresh process with ``decode_graph=on`` and one with ``off`` (alternating), each an Engine
without a cache (the paged graph) warmed up as a serving worker is, then a 256-token prompt and
``--new-tokens``; decode tokens/s, CPU ms per step, and peak RSS after load, after the warm-up and at
the end, beside ``decode_graph=auto``'s choice, the RSS budget 1.15 x (weight bytes + KV budget) +
300 MiB (issue 30) and the host's read bandwidth, measured before and after the runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# name: (architecture, layers, n_embd, heads, kv heads, n_ff): the real models' shapes.
SHAPES = {
    "smollm2-135m": ("llama", 30, 576, 9, 3, 1536),
    "smollm2-360m": ("llama", 32, 960, 15, 5, 2560),
    "qwen2.5-0.5b": ("qwen2", 24, 896, 14, 2, 4864),
    "tinyllama-1.1b": ("llama", 22, 2048, 32, 4, 5632),
    "llama3.2-3b": ("llama", 28, 3072, 24, 8, 8192),
}
_HERE = Path(__file__).parent


def model_file(name: str, weight_type: str, folder: Path) -> Path:
    from ovpool.testing.tiny import TinySpec

    arch, layers, embd, heads, kv, ff = SHAPES[name]
    path = folder / f"{name}-{weight_type}.gguf"
    if not path.exists():
        spec = TinySpec(arch=arch, weight_type=weight_type, tied=False, n_layers=layers, n_embd=embd,
                        n_heads=heads, n_kv_heads=kv, n_ff=ff, context_length=2048)
        params = sum(np.prod(s) for _, s in _shapes(name))
        # TinySpec holds every float weight at once (~4 bytes a parameter): past 1.5B a Q4_0 file
        # is written a tensor at a time instead, its 4-bit codes random.
        if weight_type == "Q4_0" and params > 1.5e9:
            write_streamed(spec, path.with_suffix(".partial"))
        else:
            spec.write(path.with_suffix(".partial"))
        path.with_suffix(".partial").rename(path)
    return path


def write_streamed(spec, path: Path) -> None:
    """``spec``'s file with random Q4_0 codes for its matrices (scales as its float weights would
    give), one tensor in memory at a time; the rest as ``TinySpec.write`` makes it."""
    import gguf

    from ovpool.testing import tiny

    rng = np.random.default_rng(spec.seed)
    plan = tiny.tensor_plan(spec)
    writer = gguf.GGUFWriter(str(path), spec.arch)
    tiny._write_hparams(writer, spec)
    tiny.write_tokenizer(writer, spec.vocab, spec.pre or tiny._PRE[spec.arch], spec.add_bos,
                         spec.chat_template)
    small = {n: _quantized(tiny._init(rng, shape, kind), kind, spec)
             for n, shape, kind in plan if kind != "matmul"}
    for name, shape, kind in plan:
        data = small.get(name)
        nbytes = shape[0] * shape[1] // 32 * 18 if data is None else data.nbytes
        raw = gguf.GGMLQuantizationType.Q4_0 if data is None else _raw_type(data, kind, spec)
        byte_shape = (shape[0], shape[1] // 32 * 18) if data is None else data.shape
        dtype = np.dtype(np.uint8) if data is None else data.dtype
        writer.add_tensor_info(name, byte_shape, dtype, nbytes, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, shape, _ in plan:
        writer.write_tensor_data(small[name] if name in small else _random_q4_0(rng, shape))
    writer.close()


def _random_q4_0(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    rows, blocks = shape[0], shape[1] // 32
    out = np.empty((rows, blocks, 18), np.uint8)
    scale = np.float16(2.5 / np.sqrt(shape[1]) / 8)  # max |w| of a block of N(0, 1/fan_in), over 8
    out[:, :, :2] = np.frombuffer(scale.tobytes(), np.uint8)
    out[:, :, 2:] = rng.integers(0, 256, (rows, blocks, 16), np.uint8)
    return out.reshape(rows, blocks * 18)


def _quantized(data: np.ndarray, kind: str, spec) -> np.ndarray:
    import gguf

    if kind != "embed":
        return data  # norms and biases stay F32, as TinySpec writes them
    return gguf.quants.quantize(data, gguf.GGMLQuantizationType[spec.embed_type])


def _raw_type(data: np.ndarray, kind: str, spec):
    import gguf

    return gguf.GGMLQuantizationType[spec.embed_type] if kind == "embed" else gguf.GGMLQuantizationType.F32


def read_bandwidth_gbs() -> float:
    """Bytes per second NumPy reads summing a 1 GiB array (best of 3), as GB/s."""
    a = np.ones(1 << 27, np.float64)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - start)
    return a.nbytes / best / 1e9


def weight_bytes_per_token(path: Path) -> int:
    from ovpool.worker.gguf.model import GGUFModel

    with GGUFModel.open(path) as model:
        return sum(int(model.raw(n).nbytes) for n in model.tensors if n != "token_embd.weight")


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
    per_token = weight_bytes_per_token(path)
    params = sum(np.prod(s) for _, s in _shapes(name))
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
            runs[choice].append(script("scale.py", "--child", str(path), "--decode-graph", choice,
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
            "bound_tps_per_gbs": 1e9 / weight_bytes_per_token(path)}


def weight_bytes(path: Path) -> int:
    from ovpool.worker.gguf.model import GGUFModel

    with GGUFModel.open(path) as model:
        return sum(int(model.raw(n).nbytes) for n in model.tensors)


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


def _shapes(name: str):
    _, layers, e, heads, kv_heads, ff = SHAPES[name]
    kv = e // heads * kv_heads
    per_layer = [(e, e), (kv, e), (kv, e), (e, e), (ff, e), (ff, e), (e, ff)]
    return [("blk", s) for _ in range(layers) for s in per_layer]


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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="smollm2-360m,qwen2.5-0.5b,tinyllama-1.1b")
    p.add_argument("--weight-type", default="Q4_0")
    p.add_argument("--dir", default="/tmp/ovpool-scale")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--plot", help="write a PNG of each cost against parameter count")
    p.add_argument("--json", action="store_true")
    p.add_argument("--graph-set", action="store_true", help="decode graph on/off at each size (above)")
    p.add_argument("--repeats", type=int, default=3, help="--graph-set: processes per choice and size")
    p.add_argument("--kv-cache-mb", type=int, default=256, help="--graph-set: the KV budget of the RSS bound")
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
    if args.graph_set:
        main_graph_set(args, cpu, folder)
        return
    bandwidth = read_bandwidth_gbs()
    rows = [measure(n, model_file(n, args.weight_type, folder), bandwidth, args)
            for n in args.sizes.split(",")]
    print(json.dumps({"cpu": cpu, "bandwidth_gbs": bandwidth, "rows": rows}, indent=2) if args.json
          else table(rows, cpu, bandwidth))
    if args.plot:
        plot(rows, args.plot, cpu)


def main_graph_set(args: argparse.Namespace, cpu: str, folder: Path) -> None:
    load, before = loadavg(), read_bandwidth_gbs()
    rows = [graph_set(n, model_file(n, args.weight_type, folder), args) for n in args.sizes.split(",")]
    bandwidth = (before, read_bandwidth_gbs())
    load += " -> " + loadavg()
    print(json.dumps({"cpu": cpu, "bandwidth_gbs": bandwidth, "loadavg": load, "rows": rows}, indent=2)
          if args.json else graph_set_table(rows, cpu, bandwidth, load))


if __name__ == "__main__":
    main()
