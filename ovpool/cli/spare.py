"""The spare worker process of ``ovpool serve`` (its supervisor side: ovpool/serve/spare.py).

``python -m ovpool.cli.spare [MODEL...]`` imports what `ovpool worker` imports before it reads
its model, reads the GGUF header and tokenizer of each MODEL (the sources of the models it may
become: ovpool.worker.opened), then waits for one line on stdin, the worker's arguments (JSON:
what follows ``python -m ovpool``), and runs as that command, taking its model's header if it
read it; end of input (serve stopped without using it) exits 0. It lives in the CLI layer, above
the worker it becomes.
"""

from __future__ import annotations

import importlib
import json
import sys

# What a worker's start imports (ovpool/cli/pool.py, _run_worker) before it has its model.
PRELOAD = ("openvino", "ovpool.cli", "ovpool.cache.prefetch", "ovpool.worker.process",
           "ovpool.worker.backend", "ovpool.worker.engine")


def main() -> None:
    from ovpool.startup import defer_heavy_imports

    defer_heavy_imports()  # as ovpool's entry does, before the imports it trims
    for module in PRELOAD:
        importlib.import_module(module)
    from ovpool.worker.opened import OpenedModels

    opened = OpenedModels.read(sys.argv[1:])
    line = sys.stdin.readline()
    if not line.strip():
        return
    sys.argv = ["ovpool", *json.loads(line)]
    from ovpool.cli import entry

    entry(opened)


if __name__ == "__main__":
    main()
