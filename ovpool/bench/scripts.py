"""The benchmarks/ scripts that ``ovpool bench`` runs as they are (``--json``), so their numbers
mean the same as when run alone. Each runs as a process group of its own, watched: should the
script or any process it started stop (SIGSTOP, a debugger) or the whole outlast its limit, the
scenario ends at once with a reason naming the process, and nothing it started is left running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ovpool import proc_state

WATCH_S = 0.5  # how often the group is looked at: a stop is reported this long after it at most


def run_script(path: Path, *args: str, limit_s: float) -> dict:
    """What ``path --json`` printed, or {"failed": why} / {"skipped": why}."""
    if not path.is_file():
        return {"skipped": f"{path} not found: run ovpool bench from a source checkout"}
    # Files, not pipes: a pipe nobody reads while we watch would block a chatty script.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, str(path), *args, "--json"], stdout=out, stderr=err,
                                start_new_session=True)
        try:
            trouble = _watch(proc, f"benchmarks/{path.name}", limit_s)
        finally:
            _end_group(proc)
        stdout, stderr = (_text(f) for f in (out, err))
    if trouble is not None:
        return {"failed": f"{trouble}; its last output: {stderr[-2000:]}"}
    if proc.returncode != 0:
        return {"failed": f"exit {proc.returncode}: {stderr[-2000:]}"}
    try:
        return json.loads(stdout[stdout.index("{"):])
    except ValueError:
        return {"failed": f"benchmarks/{path.name} printed no JSON: {stdout[-2000:]!r} {stderr[-2000:]}"}


def _watch(proc: subprocess.Popen, name: str, limit_s: float) -> str | None:
    """None once ``proc`` exits; why not, as soon as a process of its group is stopped or past the limit."""
    deadline = time.monotonic() + limit_s
    while proc.poll() is None:
        stopped = [pid for pid in proc_state.group(proc.pid) if proc_state.stopped(pid)]
        if stopped:
            pid = stopped[0]
            return (f"{name} was ended: its process {pid} ({proc_state.command(pid)}) is stopped"
                    " (SIGSTOP or a debugger)")
        if time.monotonic() >= deadline:
            return f"{name} was ended: it ran past its limit of {limit_s:.0f} s (hung?)"
        time.sleep(WATCH_S)
    return None


def _end_group(proc: subprocess.Popen) -> None:
    """SIGKILL the script's whole group (what it started and left, or all of it if it is hung)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _text(f) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")
