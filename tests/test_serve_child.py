"""ChildProcess: output forwarding, error tail, clean stop, and no orphan when serve is killed."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

from serve_helpers import alive, wait_for

from ovpool.serve.child import ChildProcess

SLEEPER = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"]


def test_failing_child_reports_its_error_line_and_status():
    out = io.BytesIO()
    argv = [sys.executable, "-c",
            "import sys; print('loading'); print('error: model cache MISS abc: device differs', "
            "file=sys.stderr); print('bye'); sys.exit(2)"]
    with ChildProcess("w", argv, output=out) as child:
        assert wait_for(lambda: child.poll() is not None)
    assert child.poll() == 2
    assert child.last_error() == "error: model cache MISS abc: device differs"
    assert b"loading" in out.getvalue() and b"bye" in out.getvalue()


def test_stop_ends_the_child_and_its_group():
    grandchild = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
                  "'import time; time.sleep(600)']); print(p.pid, flush=True); time.sleep(600)")
    out = io.BytesIO()
    with ChildProcess("w", [sys.executable, "-c", grandchild], output=out) as child:
        assert wait_for(lambda: out.getvalue().strip())
        grand = int(out.getvalue().split()[0])
        assert alive(child.pid) and alive(grand)
        assert os.getpgid(child.pid) == child.pid != os.getpgid(0)
    assert child.poll() == -signal.SIGTERM
    assert wait_for(lambda: not alive(grand), 60)


def test_child_that_ignores_sigterm_is_killed_after_the_grace():
    argv = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('x', flush=True); time.sleep(600)"]
    out = io.BytesIO()
    child = ChildProcess("w", argv, output=out).__enter__()
    assert wait_for(lambda: out.getvalue())
    started = time.monotonic()
    assert child.stop(grace_s=0.5) == -signal.SIGKILL
    assert 0.5 <= time.monotonic() - started < 30  # the grace, then SIGKILL (the bound: a hang's guard)


def test_children_die_with_a_killed_parent():
    parent_code = (
        "import sys; from ovpool.serve.child import ChildProcess\n"
        f"c = ChildProcess('w', {SLEEPER!r}).__enter__()\n"
        "print(c.pid, flush=True); import time; time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL)
    try:
        child_pid = int(parent.stdout.readline())
        assert alive(child_pid)
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
    assert wait_for(lambda: not alive(child_pid), 60), "child outlived its SIGKILLed parent"
