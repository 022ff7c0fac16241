"""A worker process started before its model is known: a load then skips the interpreter's start
and the imports, a second or more of a warm swap (docs/performance.md, Model swaps).

``python -m ovpool.serve.spare [MODEL...]`` imports what `ovpool worker` imports before it reads
its model, reads the GGUF header and tokenizer of each MODEL (the sources of the models it may
become: ovpool.worker.opened), then waits for one line on stdin, the worker's arguments (JSON:
what follows ``python -m ovpool``), and runs as that command, taking its model's header if it
read it; end of input (serve stopped without using it) exits 0. ``SpareWorker`` keeps one for a
pool that loads models on demand.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Sequence

from ovpool.serve.child import ChildProcess

# What a worker's start imports (ovpool/cli/pool.py, _run_worker) before it has its model.
PRELOAD = ("openvino", "ovpool.cli", "ovpool.cache.prefetch", "ovpool.worker.process",
           "ovpool.worker.backend", "ovpool.worker.engine")
# A spare that keeps exiting on its own (a broken environment) is given up: workers start plainly.
_MAX_FAILURES = 3
# A spare starts this long after the latest worker start, once the pool has no request queued or
# running (a new worker's first requests and set-up take the cores for seconds, and the spare's
# imports, ~1-2 s of CPU, would slow them), or after SPARE_LATEST_S however busy it is.
SPARE_AFTER_S = 10.0
SPARE_LATEST_S = 30.0
# Models a spare reads ahead: the likeliest next loads. Each costs the spare its tokenizer's
# memory while it waits (smollm2 ~19 MiB, gemma3-270m ~48 MiB) and ~0.05-0.2 s of CPU at its start.
READ_AHEAD = 2


def spare_due(since_start_s: float, status: dict | None) -> bool:
    """Whether to start a spare ``since_start_s`` after the latest worker start, given the
    broker's ``status`` (None: not known)."""
    if since_start_s >= SPARE_LATEST_S:
        return True
    busy = status is None or any((status.get("queues") or {}).values()) \
        or any(w.get("active") for w in status.get("workers", []))
    return since_start_s >= SPARE_AFTER_S and not busy


class SpareWorker:
    """At most one spare process of ``python`` with ``env`` (the workers' environment)."""

    def __init__(self, python: str, env: dict[str, str] | None):
        self._argv = [python, "-m", "ovpool.serve.spare"]
        self._env = env
        self._child: ChildProcess | None = None
        self._failures = 0

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def keep_one(self, sources: Sequence[str] = ()) -> None:
        """Start a spare unless one runs (call when no worker is starting: it competes for CPU),
        reading ahead the first READ_AHEAD models of ``sources`` (the likeliest next first)."""
        if self._child is not None and self._child.poll() is None:
            return
        if self._child is not None:  # it exited before any use
            self._failures += 1
            self._child.stop()
            self._child = None
        if self._failures < _MAX_FAILURES:
            argv = [*self._argv, *sources[:READ_AHEAD]]
            self._child = ChildProcess("spare", argv, env=self._env, stdin=True).__enter__()

    def take(self, name: str, argv: Sequence[str]) -> ChildProcess | None:
        """The spare, now running worker ``name`` with ``argv`` (``python -m ovpool ...``); None if
        there is none alive (start the worker plainly)."""
        child, self._child = self._child, None
        if child is None:
            return None
        if child.poll() is None:
            try:
                return child.launch(name, argv)
            except OSError:  # it exited meanwhile
                pass
        child.stop()
        return None

    def close(self) -> None:
        if self._child is not None:
            self._child.stop()
            self._child = None


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
