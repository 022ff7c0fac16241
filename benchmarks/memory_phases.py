"""Where an engine's memory comes from: its RSS after each step of a warm-up, one step at a time.

    .venv/bin/python benchmarks/memory_phases.py [--model smollm2] [--set decode_graph=on ...]

One fresh process per ``--set`` group (the defaults when none is given; repeat ``--set`` for several
groups), an Engine without a cache (the paged graph, as ``engine_vs_genai.py`` loads it), then,
in order: the decode graph's compile (where there is one), the first pass of 8 rows (the CPU
plugin's kernel layout for passes of 7 rows and more), of 2 rows (the one for 2-6 rows, for some
MatMuls a second layout of their weights), of 1 row (the decode graph's, where there is one), and a
300-row pass. After each: VmRSS, its anonymous part (the plugin's packed weights live there; the
built constants are in a file mapping that ovpool.worker.graph.arena releases) and the peak (VmHWM).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

STEPS = (("decode graph compile", 0), ("first pass of 8 rows", 8), ("first pass of 2 rows", 2),
         ("first pass of 1 row", 1), ("a pass of 300 rows", 300))
FIELDS = {"VmRSS": "rss", "RssAnon": "anon", "VmHWM": "peak"}


def status_mib() -> dict[str, int]:
    with open("/proc/self/status") as f:
        rows = [line.split() for line in f if line.split(":")[0] in FIELDS]
    return {FIELDS[row[0].rstrip(":")]: int(row[1]) // 1024 for row in rows}


def child(model: str, settings: dict[str, str]) -> list[dict]:
    from ovpool import Engine

    engine = Engine(model, cache_dir="", settings=settings)
    time.sleep(0.3)  # the arena's release thread returns the built constants' pages
    phases = [{"phase": "load", **status_mib()}]
    session = engine._acquire()
    for phase, rows in STEPS:
        if rows == 0:
            session.prepare()
        else:
            session.forward(list(range(1000, 1000 + rows)), logits_from=rows - 1)
        time.sleep(0.3)
        phases.append({"phase": phase, **status_mib()})
    return phases


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--set", action="append", nargs="*", default=None, metavar="NAME=VALUE",
                   help="one group of settings per --set (default: one run at the defaults)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.model, json.loads(args.child))))
        return
    for group in args.set or [[]]:
        settings = dict(item.split("=", 1) for item in group)
        cmd = [sys.executable, __file__, "--model", args.model, "--child", json.dumps(settings)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        print(f"{args.model} {settings or '(defaults)'}: MiB rss / anonymous / peak")
        previous = None
        for row in json.loads(out.strip().splitlines()[-1]):
            grew = f"  (anonymous {row['anon'] - previous:+d})" if previous is not None else ""
            print(f"  {row['phase']:<22}{row['rss']:>6}{row['anon']:>6}{row['peak']:>6}{grew}")
            previous = row["anon"]


if __name__ == "__main__":
    main()
