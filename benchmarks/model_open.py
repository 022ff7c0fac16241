"""A model swap's Python part, two source trees alternated: ``GGUFModel.open`` (the GGUF header and
its vocabulary) and the tokenizer built from its metadata, in process CPU seconds.

    .venv/bin/python benchmarks/model_open.py --tree new=/work/main --tree base=/tmp/base
        [--model gemma3-270m] [--rounds 5] [--repeats 5]

Each round runs every tree once, in a fresh subprocess with that tree first on PYTHONPATH (and the
working directory elsewhere, so the editable install does not shadow it); which tree goes first
alternates. A subprocess opens the model ``--repeats`` times (the file in the page cache after the
first) and keeps the median. Reported: each side's median over rounds, and the median of the
per-round ratios first tree / second tree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, statistics, sys, time
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.text.tokenizer import Tokenizer
model, repeats = sys.argv[1], int(sys.argv[2])
opens, builds = [], []
for _ in range(repeats):
    start = time.process_time()
    gguf = GGUFModel.open(model)
    opened = time.process_time()
    Tokenizer.from_metadata(gguf.metadata)
    opens.append(opened - start)
    builds.append(time.process_time() - opened)
print(json.dumps({"tree": __import__("ovpool").__file__, "open_s": statistics.median(opens),
                  "tokenizer_s": statistics.median(builds)}))
"""


def run_child(tree: str, model: str, repeats: int) -> dict:
    env = {**os.environ, "PYTHONPATH": tree}
    with tempfile.TemporaryDirectory() as cwd:
        out = subprocess.run([sys.executable, "-c", CHILD, model, str(repeats)], env=env, cwd=cwd,
                             check=True, capture_output=True, text=True).stdout
    result = json.loads(out.splitlines()[-1])
    if not result["tree"].startswith(os.path.abspath(tree)):
        raise SystemExit(f"tree {tree}: imported {result['tree']} instead")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH, twice")
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    if len(trees) != 2:
        raise SystemExit("give --tree NAME=PATH exactly twice")
    names = list(trees)
    rounds = []
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        rounds.append({name: run_child(trees[name], args.model, args.repeats) for name in order})
    for key in ("open_s", "tokenizer_s", "total"):
        def value(res, k=key):
            return res["open_s"] + res["tokenizer_s"] if k == "total" else res[k]
        medians = [statistics.median(value(rd[n]) for rd in rounds) for n in names]
        ratio = statistics.median(value(rd[names[0]]) / value(rd[names[1]]) for rd in rounds)
        print(f"{key:<12} {names[0]} {medians[0]:.4f} s  {names[1]} {medians[1]:.4f} s  "
              f"{names[0]}/{names[1]} {ratio:.3f} (median of {len(rounds)} paired rounds)")


if __name__ == "__main__":
    main()
