"""Memory of one `ovpool serve` with 1, 2 and 3 models loaded, against the sum of single-model pools.

Three models (SmolLM2, gemma3-270m and a tiny generated llama): first one pool per model (`ovpool
serve --model M`, which also warms the compiled-model cache), then one pool of all three (`--model
A --model B --model C --keep-alive -1`, no budget) that gets a request for each in turn. After each
request and ``--settle`` idle seconds (the worker's warm-up and batching graph), the PSS and RSS
of every process of the pool (serve, broker, HTTP API, workers) from /proc/PID/smaps_rollup. PSS
counts a page shared between processes once across them, so a pool's PSS is what it takes; RSS
counts shared libraries again in each process.

    .venv/bin/python benchmarks/pool_memory.py [--settle 25] [--workdir DIR] [--only MODEL] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from model_swap import first_token_s, wait_for_broker

from ovpool.client import Client
from ovpool.demo import free_port
from ovpool.testing.pool import wait_for_workers
from ovpool.testing.tiny import write_tiny_model

MODELS = ("smollm2", "gemma3-270m", "tiny")


def rollup(pid: int) -> tuple[int, int]:
    """(PSS, RSS) of ``pid`` in KiB; (0, 0) if it is gone."""
    found = {"Pss:": 0, "Rss:": 0}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key = line.split(maxsplit=1)[0] if line else ""
            if key in found:
                found[key] = int(line.split()[1])
    except OSError:
        pass
    return found["Pss:"], found["Rss:"]


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[-1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def pool_memory(serve_pid: int, state_file: Path) -> dict:
    """PSS and RSS (MiB) of serve and all its descendants; of its workers alone and its spare
    worker process (serve's state file names them)."""
    tree, todo, pids = _children(), [serve_pid], []
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(tree.get(pid, []))
    rows = {pid: rollup(pid) for pid in pids}
    state = json.loads(state_file.read_text())
    workers = [rows.get(w["pid"], (0, 0)) for w in state["workers"] if w.get("pid")]
    spare = rows.get(state.get("spare_pid"), (0, 0))
    return {"pss_mib": round(sum(p for p, _ in rows.values()) / 1024),
            "rss_mib": round(sum(r for _, r in rows.values()) / 1024),
            "workers_pss_mib": round(sum(p for p, _ in workers) / 1024),
            "workers_rss_mib": round(sum(r for _, r in workers) / 1024),
            "spare_pss_mib": round(spare[0] / 1024), "processes": len(rows), "workers": len(workers)}


def settled(serve_pid: int, state_file: Path, settle_s: float, limit_s: float = 240.0) -> dict:
    """``pool_memory`` once the workers' PSS has settled: ``settle_s`` idle seconds, then readings
    5 s apart until two agree within 1% (a new worker's warm-up and batching graph compile take
    20 s or more on a loaded host), or ``limit_s`` has passed (then ``settled`` is false)."""
    time.sleep(settle_s)
    last, deadline = pool_memory(serve_pid, state_file), time.monotonic() + limit_s
    while time.monotonic() < deadline:
        time.sleep(5.0)
        now = pool_memory(serve_pid, state_file)
        if abs(now["workers_pss_mib"] - last["workers_pss_mib"]) <= 0.01 * max(1, last["workers_pss_mib"]):
            return {**now, "settled": True}
        last = now
    return {**last, "settled": False}


def _run_pool(models: dict[str, str], workdir: Path, settle_s: float, log_name: str) -> list[dict]:
    """One pool serving ``models`` (name -> path or alias): its memory after each first request."""
    port, http = free_port(), free_port()
    argv = [sys.executable, "-m", "ovpool", "serve", "--open", "--bind", f"tcp://127.0.0.1:{port}",
            "--http", f"127.0.0.1:{http}", "--cache-dir", str(workdir / "cache"), "--keep-alive", "-1",
            "--state-file", str(workdir / f"{log_name}.state.json")]
    for name, source in models.items():
        argv += ["--model", f"{name}={source}"]
    rows = []
    with open(workdir / log_name, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        with Client(f"tcp://127.0.0.1:{port}") as client:
            wait_for_broker(client)
            if len(models) == 1:  # past the broker's start-up grace a request needs its worker
                wait_for_workers(client, 1, timeout=900)
            for name in models:
                first_token_s(client, name)
                rows.append({"loaded": len(rows) + 1, "model": name,
                             **settled(proc.pid, workdir / f"{log_name}.state.json", settle_s)})
    finally:
        proc.terminate()
        proc.wait(60)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settle", type=float, default=25.0,
                        help="idle seconds before the readings (then until the PSS settles)")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", choices=MODELS, help="just this model's single-model pool")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        sources = {"smollm2": "smollm2", "gemma3-270m": "gemma3-270m",
                   "tiny": str(write_tiny_model(workdir / "tiny.gguf"))}
        if args.only:
            sources = {args.only: sources[args.only]}
        single = {name: _run_pool({name: src}, workdir, args.settle, f"single-{name}.log")[0]
                  for name, src in sources.items()}
        pooled = [] if args.only else _run_pool(sources, workdir, args.settle, "pool.log")
    result = {"cpu_count": os.cpu_count(), "loadavg": Path("/proc/loadavg").read_text().split()[:3],
              "single": single, "pool": pooled}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print("| pool | processes | PSS MiB | RSS MiB | workers' PSS MiB | spare's PSS MiB |")
    print("|---|---|---|---|---|---|")
    for name, row in single.items():
        print(f"| {name} alone | {row['processes']} | {row['pss_mib']:,} | {row['rss_mib']:,} | "
              f"{row['workers_pss_mib']:,} | - |")
    for row in pooled:
        names = ", ".join(MODELS[:row["loaded"]])
        summed = sum(single[n]["pss_mib"] for n in MODELS[:row["loaded"]])
        print(f"| one pool, {names} loaded | {row['processes']} | {row['pss_mib']:,} (single pools summed: "
              f"{summed:,}) | {row['rss_mib']:,} | {row['workers_pss_mib']:,} | {row['spare_pss_mib']} |")


if __name__ == "__main__":
    main()
