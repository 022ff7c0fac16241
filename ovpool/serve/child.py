"""One child process of ``ovpool serve``, owned by a context manager that never leaves an orphan.

Each child leads its own process group, so a terminal's Ctrl-C reaches only serve (which then
stops workers before the broker) and stopping a child signals everything it may have spawned.
The kernel sends the child SIGTERM if serve itself dies, even by SIGKILL (PR_SET_PDEATHSIG), so
no path leaves a worker running without its supervisor.

The child's stdout and stderr are forwarded line by line to serve's stderr; the last lines are
kept so a worker that dies at start can be reported with its own error message.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO

from ovpool import timing

_PR_SET_PDEATHSIG = 1
# Loaded before any fork: the child must not take import locks between fork and exec.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def terminate(proc: subprocess.Popen, grace_s: float = timing.SHUTDOWN_GRACE_S) -> int:
    """SIGTERM ``proc``, wait up to ``grace_s``, then SIGKILL; returns the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def _child_setup(parent_pid: int) -> None:
    """Runs in the child between fork and exec: own group, die with the parent."""
    os.setpgid(0, 0)
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)


class ChildProcess:
    """``argv`` as a supervised child; ``with`` starts it and stops it (SIGTERM, then SIGKILL)."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None,
                 output: IO[bytes] | None = None, tail_lines: int = 20, stdin: bool = False):
        self.name = name
        self._argv, self._env = list(argv), env
        self._stdin = stdin  # a spare (serve/spare.py): its command line comes later, on stdin
        self._output = output if output is not None else sys.stderr.buffer
        self._tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._proc: subprocess.Popen | None = None
        self._forwarder: threading.Thread | None = None

    @property
    def pid(self) -> int:
        assert self._proc is not None, f"{self.name} is not started"
        return self._proc.pid

    def __enter__(self) -> ChildProcess:
        parent = os.getpid()
        self._proc = subprocess.Popen(
            self._argv, env=self._env, stdin=subprocess.PIPE if self._stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, preexec_fn=lambda: _child_setup(parent), close_fds=True)
        self._forwarder = threading.Thread(target=self._forward, name=f"out-{self.name}", daemon=True)
        self._forwarder.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def launch(self, name: str, argv: Sequence[str]) -> ChildProcess:
        """A spare becomes ``name``, running ``argv`` (``python -m ovpool ARGS``: ARGS go to it)."""
        assert self._stdin and list(argv[1:3]) == ["-m", "ovpool"], argv
        self.name = name
        self._proc.stdin.write(json.dumps(list(argv[3:])).encode() + b"\n")
        self._proc.stdin.close()
        return self

    def poll(self) -> int | None:
        """The exit status once the child has exited (negative: killed by that signal), else None."""
        return self._proc.poll()

    def last_error(self) -> str:
        """The child's last non-empty output line that looks like an error, else its last line."""
        lines = [line for line in self._tail if line.strip()]
        errors = [line for line in lines if "error" in line.lower()]
        return (errors or lines or [""])[-1].strip()

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group (gone already: nothing to do)."""
        try:
            os.killpg(self._proc.pid, sig)
        except ProcessLookupError:
            pass

    def yield_cpu(self) -> None:
        """Lowest CPU priority (nice 19) for every thread of the child's group: it is leaving and
        should not take the cores from the workers that stay or start (raising it back would
        need privileges; nobody does)."""
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PGRP, self._proc.pid, 19)

    def stop(self, grace_s: float = timing.SHUTDOWN_GRACE_S) -> int:
        """SIGTERM, wait up to ``grace_s``, then SIGKILL; returns the exit status."""
        if self._proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self._proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self._proc.wait()
        self.signal(signal.SIGKILL)  # anything the child left behind in its group
        if self._proc.stdin is not None and not self._proc.stdin.closed:  # a spare never used
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        self._forwarder.join(timeout=grace_s)
        return self._proc.returncode

    def _forward(self) -> None:
        with self._proc.stdout as pipe:
            for raw in pipe:
                self._tail.append(raw.decode("utf-8", "replace"))
                try:
                    self._output.write(raw)
                    self._output.flush()
                except (OSError, ValueError):  # serve's stderr closed: keep draining the pipe
                    pass
