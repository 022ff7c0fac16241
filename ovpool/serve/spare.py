"""A worker process started before its model is known: a load then skips the interpreter's start
and the imports, a second or more of a warm swap (docs/performance.md, Model swaps).

The process is ``python -m ovpool.cli.spare [MODEL...]`` (what it runs: ovpool/cli/spare.py); it
waits, imports done, for the command line of the worker it becomes. ``SpareWorker`` keeps one for
a pool that loads models on demand.
"""

from __future__ import annotations

from collections.abc import Sequence

from ovpool.serve.child import ChildProcess

# A spare that keeps exiting on its own (a broken environment) is given up: workers start plainly.
_MAX_FAILURES = 3
# A spare starts this long after the latest worker start, once the pool has no request queued or
# running (a new worker's first requests and set-up take the cores for seconds, and the spare's
# imports, ~1-2 s of CPU, would slow them), or after SPARE_LATEST_S however busy it is.
SPARE_AFTER_S = 10.0
SPARE_LATEST_S = 30.0
# Models a spare reads ahead: the likeliest next loads. Each costs the spare its tokenizer's
# memory while it waits and some CPU at its start (docs/performance.md, Model swaps).
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
        self._argv = [python, "-m", "ovpool.cli.spare"]
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
