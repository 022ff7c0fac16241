"""Time to first token of a long prefix after a restart, with the disk KV tier and without.

Each run is a fresh worker-like process on one cache directory (the compiled-model cache already
populated, so both sides import the same graphs): an Engine with ``prefix_cache=on``, its Batcher
set up (``warm_up``), then one greedy request whose prompt is a ``--prefix``-token prefix and a
short suffix of its own. TTFT is timed inside the process from the request's admission to its
first token, so start-up is not in it. Runs alternate (without, with; then with, without; ...), and
the figures are medians over ``--repeats`` pairs. The tier's read and write bandwidth come from its
own counters (read: the blocks a run loaded, page cache warm unless ``--evict``, which drops the
block files' pages first with POSIX_FADV_DONTNEED; write: the blocks the populating run wrote, tmp +
fsync + rename each). The break-even prefix: loading a block costs ``load_s_per_block``, computing
its tokens ``compute_s_per_token × block_size`` in a run without the tier; the tier pays from the
first full block when the first is smaller (a prefix shorter than a block has nothing to load).

    .venv/bin/python benchmarks/kv_tier.py [--model smollm2] [--prefix 2000] [--repeats 3]
        [--precision auto] [--evict] [--second-worker] [--json]

``--second-worker``: the worker that wrote the prefix's blocks stays up (idle) while the pairs run,
so "with" is a second worker beside it taking its prefix, not a restart.

Goal (issue 29): TTFT with the tier ≤ 0.15× without. Each pair also checks that both runs chose the
same greedy tokens (``same_tokens``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUFFIX = 24  # tokens after the prefix, different in every run


def prompt(prefix: int, salt: int) -> list[int]:
    """``prefix`` fixed token ids, then SUFFIX of run ``salt``'s own (ordinary ids of SmolLM2's)."""
    shared = [100 + (i * 7919) % 20000 for i in range(prefix)]
    return shared + [200 + (salt * 31 + i) % 5000 for i in range(SUFFIX)]


def child(args: argparse.Namespace) -> dict:
    from ovpool import Engine
    from ovpool.sampling_params import SamplingParams
    from ovpool.worker.events import Token

    settings = {"prefix_cache": "on", "kv_tier": args.child == "on", "inference_precision": args.precision,
                "max_prompt_tokens": args.prefix + SUFFIX + 8}
    with Engine(args.model, cache_dir=args.cache_dir, settings=settings) as engine:
        batcher = engine.batcher(max_running=2)
        batcher.warm_up()
        start = time.perf_counter()
        batcher.add("r", prompt(args.prefix, args.salt), SamplingParams(max_tokens=8, ignore_eos=True))
        ttft, tokens = None, []
        while batcher.active:
            for event in batcher.step():
                if isinstance(event, Token):
                    ttft = ttft or time.perf_counter() - start
                    tokens.append(event.delta.token_id)
        tier = batcher.tier.tier if batcher.tier else None
        if tier is not None:
            tier.flush(120)
        result = {"ttft_s": ttft, "tokens": tokens, "cached": batcher.cached_prompt_tokens,
                "block_size": batcher.runner.block_size, "block_bytes": batcher.runner.block_bytes,
                "stats": dict(tier.stats) if tier else None}
        if args.hold:  # a worker that stays up beside the next ones
            print(json.dumps(result), flush=True)
            sys.stdin.readline()
        return result


def command(args: argparse.Namespace, cache_dir: Path, mode: str, salt: int) -> list[str]:
    return [sys.executable, __file__, "--child", mode, "--cache-dir", str(cache_dir), "--model", args.model,
            "--prefix", str(args.prefix), "--salt", str(salt), "--precision", args.precision]


def run(args: argparse.Namespace, cache_dir: Path, mode: str, salt: int) -> dict:
    out = subprocess.run(command(args, cache_dir, mode, salt), capture_output=True, text=True, check=False)
    if out.returncode:
        sys.exit(f"child {mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def evict(kv_dir: Path) -> None:
    for path in kv_dir.glob("*/*.kv"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def rate(stats: dict, kind: str) -> float:
    key = "read" if kind == "read" else "written"
    seconds = stats[f"{kind}_s"]
    return stats[f"{key}_bytes"] / seconds / 2**20 if seconds else float("nan")


def measure(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="ovpool-kv-tier-") as tmp, contextlib.ExitStack() as stack:
        cache_dir = Path(tmp)
        if args.second_worker:  # compiles, exports, writes the prefix's blocks, stays up
            first = subprocess.Popen([*command(args, cache_dir, "on", 0), "--hold"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            stack.callback(first.communicate, "\n")
            populate = json.loads(first.stdout.readline())
        else:
            populate = run(args, cache_dir, "on", salt=0)  # the same, then exits: the pairs restart
        pairs = []
        for r in range(args.repeats):
            order = ("off", "on") if r % 2 == 0 else ("on", "off")
            got = {}
            for mode in order:
                if mode == "on" and args.evict:
                    evict(cache_dir / "v1" / "kv")
                got[mode] = run(args, cache_dir, mode, salt=r + 1)
            pairs.append(got)
    off = statistics.median(p["off"]["ttft_s"] for p in pairs)
    on = statistics.median(p["on"]["ttft_s"] for p in pairs)
    loads = [p["on"]["stats"] for p in pairs]
    block = populate["block_size"]
    load_per_block = statistics.median(s["read_s"] / s["hits"] for s in loads if s["hits"])
    compute_per_token = off / (args.prefix + SUFFIX)
    return {
        "prefix_tokens": args.prefix, "repeats": args.repeats, "precision": args.precision,
        "evict": args.evict, "second_worker": args.second_worker,
        "ttft_without_s": off, "ttft_with_s": on, "ratio": on / off,
        "cached_prompt_tokens": statistics.median(p["on"]["cached"] for p in pairs),
        "same_tokens": all(p["on"]["tokens"] == p["off"]["tokens"] for p in pairs),
        "block_size": block, "block_bytes": populate["block_bytes"],
        "read_mib_s": statistics.median(rate(s, "read") for s in loads),
        "write_mib_s": rate(populate["stats"], "write"),
        "load_s_per_block": load_per_block, "compute_s_per_token": compute_per_token,
        "break_even_tokens": block if load_per_block < compute_per_token * block else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prefix", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--precision", default="auto", help="inference_precision of both sides")
    parser.add_argument("--evict", action="store_true", help="drop the block files' pages before each load")
    parser.add_argument("--second-worker", action="store_true",
                        help="the worker that wrote the prefix stays up beside the measured ones")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    parser.add_argument("--salt", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    result = measure(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        print(f"{key:>22}: {value:.4g}" if isinstance(value, float) else f"{key:>22}: {value}")


if __name__ == "__main__":
    main()
