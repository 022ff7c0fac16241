"""The first pass of each shape class on a graph imported from the cache, and what the CPU plugin
does in it: the cost a cache hit pays before its first token (issues 28 and 30).

    .venv/bin/python benchmarks/first_pass.py [--model smollm2] [--set q4_storage=i8 ...] [--rounds 3]

Each ``--set`` group (one group of the defaults when none is given; a group is a comma-separated
list of NAME=VALUE) runs in a child process that builds the single-stream graph a cache hit imports
(stateful, SDPA), compiles and exports it once, then per round imports the blob afresh and runs, in
order: 1 row, 1 row again, 18 rows, 18 rows again, then one decode row after the 18. The plugin lays
the weights out for its kernels at the first pass of each class of row counts (1-6, 7+ for
SmolLM2), so "first" minus "again" is that set-up. Process CPU seconds (the reorder runs on every
core). Rounds alternate between the groups; medians. The last group-by-group line says whether the
18-row logits and the decode row's equal the first group's bit for bit.

One more child per group, with ``ONEDNN_VERBOSE=profile_create``, lists the weight reorders the
first 1-row and 18-row passes create (oneDNN implementation, element type, source and blocked
target layout), and the layout each inner product asks for per row count.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PASSES = (("1 row", 1), ("1 row again", 1), ("18 rows", 18), ("18 rows again", 18))
REORDER = re.compile(r"create:cache_miss,cpu,reorder,([^,]+),undef,src:(\w+)::blocked:(\w+)::f0 "
                     r"dst:\w+:\w*:blocked:(A\w+)::f0")
INNER = re.compile(r"inner_product,[^,]+,[^,]+,src:\S+ wei:(\w+):\w*:blocked:(\w+)::f0.*,mb(\d+)ic\d+oc(\d+)")


def compiled_blob(model_name: str, sets: dict[str, str]) -> tuple[bytes, dict]:
    """The exported single-stream graph of ``model_name`` with graph settings ``sets``, and its
    compile config."""
    import openvino as ov

    from ovpool.config import GraphConfig
    from ovpool.models import resolve_model_path
    from ovpool.worker.gguf.model import GGUFModel
    from ovpool.worker.graph import builder, compile_settings
    from ovpool.worker.graph.weights import Encoding, int8_groups

    core = ov.Core()
    graph = GraphConfig.from_values({**GraphConfig().values(), **sets, "attention": "sdpa"})
    settings = compile_settings.resolve_auto(graph, "CPU", core)
    model = GGUFModel.open(resolve_model_path(model_name))
    config = compile_settings.compile_config(graph, "CPU", core,
                                    int8_groups(model, Encoding.of(GraphConfig.from_values(settings))))
    out = io.BytesIO()
    core.compile_model(builder.build_model(model, settings), "CPU", config).export_model(out)
    return out.getvalue(), config


def inputs(rows: int, position: int = 0) -> dict:
    import numpy as np

    return {"input_ids": (np.arange(rows)[None] * 7 + 11).astype(np.int64),
            "attention_mask": np.ones((1, position + rows), np.int64),
            "position_ids": (position + np.arange(rows))[None].astype(np.int64),
            "beam_idx": np.zeros(1, np.int32), "logits_from": np.zeros(1, np.int64)}


def one_round(core, blob: bytes, config: dict, out_dir: Path | None) -> dict[str, float]:
    """Import ``blob`` and run PASSES, then a decode row; CPU seconds of each (logits saved to
    ``out_dir`` if given)."""
    import numpy as np
    import openvino as ov

    cpu = time.process_time()
    compiled = core.import_model(ov.Tensor(np.frombuffer(blob, np.uint8)), "CPU", config)
    times = {"import": time.process_time() - cpu}
    request = compiled.create_infer_request()
    for name, rows in PASSES:
        request.reset_state()
        cpu = time.process_time()
        request.infer(inputs(rows))
        times[name] = time.process_time() - cpu
    prefill = request.get_output_tensor(0).data.copy()
    request.infer(inputs(1, 18))
    if out_dir is not None:
        np.save(out_dir / "prefill.npy", prefill)
        np.save(out_dir / "decode.npy", request.get_output_tensor(0).data)
    return times


def child(args: argparse.Namespace) -> None:
    import openvino as ov

    blob, config = compiled_blob(args.model, json.loads(args.child))
    core, out = ov.Core(), Path(args.out) if args.out else None
    rounds = [one_round(core, blob, config, out) for _ in range(args.rounds)]
    print(json.dumps(rounds))


def run_child(args: argparse.Namespace, sets: dict, rounds: int, out: str = "", env: dict | None = None):
    cmd = [sys.executable, __file__, "--model", args.model, "--child", json.dumps(sets),
           "--rounds", str(rounds), "--out", out]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"child {sets} failed:\n{done.stderr[-3000:]}")
    return done


def reorders(text: str) -> tuple[collections.Counter, dict]:
    """(weight reorders by implementation and layouts, {(weight type, rows out): {row counts: layout}})."""
    found = collections.Counter(m.groups() for m in REORDER.finditer(text))
    layouts: dict = collections.defaultdict(dict)
    for dtype, tag, mb, oc in INNER.findall(text):
        layouts[(dtype, int(oc))][int(mb)] = tag
    return found, layouts


def report(groups: list[dict], runs: list[list[dict]], traces: list[str], same: list[tuple]) -> None:
    for sets, rounds, trace, equal in zip(groups, runs, traces, same, strict=True):
        print(f"\n{sets or 'defaults'}: CPU s, median of {len(rounds)} (first - again = the set-up)")
        for key in rounds[0]:
            print(f"  {key:<14} {statistics.median(r[key] for r in rounds):.3f}")
        found, layouts = reorders(trace)
        for (impl, dtype, src, dst), n in sorted(found.items()):
            print(f"  reorder {impl:<30} {dtype} {src} -> {dst}: {n}")
        for (dtype, oc), by_rows in sorted(layouts.items()):
            tags = ", ".join(f"{m} rows {t}" for m, t in sorted(by_rows.items()))
            print(f"  weights {dtype} {oc} rows out: {tags}")
        print(f"  logits equal to the first group's: 18-row prefill {equal[0]}, decode row {equal[1]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--set", action="append", default=[], help="a group: NAME=VALUE[,NAME=VALUE]")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        child(args)
        return
    from ovpool.settings import parse_assignments
    from ovpool.worker.graph.cpu_class import CpuInfo

    groups = [parse_assignments(g.split(",")) for g in args.set] or [{}]
    print(f"{CpuInfo.read().describe()}; load {Path('/proc/loadavg').read_text().split()[0]}; "
          f"model {args.model}")
    runs: list[list[dict]] = [[] for _ in groups]
    with tempfile.TemporaryDirectory() as tmp:
        dirs = [Path(tmp) / str(i) for i in range(len(groups))]
        for d in dirs:
            d.mkdir()
        for r in range(args.rounds):
            order = range(len(groups)) if r % 2 == 0 else reversed(range(len(groups)))
            for i in order:
                runs[i] += json.loads(run_child(args, groups[i], 1, str(dirs[i])).stdout.splitlines()[-1])
        same = [_equal(dirs[0], d) for d in dirs]
    env = {**os.environ, "ONEDNN_VERBOSE": "profile_create"}
    traces = [run_child(args, g, 1, env=env).stdout for g in groups]
    report(groups, runs, traces, same)
    print(f"load at end {Path('/proc/loadavg').read_text().split()[0]}")


def _equal(a: Path, b: Path) -> tuple[bool, bool]:
    import numpy as np

    return tuple(bool(np.array_equal(np.load(a / f), np.load(b / f))) for f in ("prefill.npy", "decode.npy"))


if __name__ == "__main__":
    main()
