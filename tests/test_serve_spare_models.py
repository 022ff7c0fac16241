"""serve's spare worker process (serve/spare.py): with several models, a load starts in a process
that has its imports done, which then runs the model's worker as a plain start would."""

from __future__ import annotations

import shutil
import sys

import pytest
from serve_helpers import serve, wait_for

from ovpool.client import Client
from ovpool.serve.spare import SpareWorker


@pytest.mark.slow
def test_a_load_takes_the_spare_process_and_a_new_spare_follows(tmp_path):
    with serve(tmp_path, "--backend", "null", "--model", "a", "--model", "b", "--max-loaded", "1") as served:
        served.wait_service("broker")
        spare = wait_for(lambda: served.state().get("spare_pid"), 60, "a spare process")
        with Client(served.endpoint) as client:
            assert client.complete("hi", model="a", max_tokens=2, timeout=60).usage.completion_tokens == 2
            assert worker_pid(served, "a:CPU") == spare
            after = wait_for(lambda: served.state().get("spare_pid") not in (None, spare) and
                             served.state()["spare_pid"], 60, "the next spare")
            assert client.complete("hi", model="b", max_tokens=2, timeout=60).usage.completion_tokens == 2
            assert worker_pid(served, "b:CPU") == after
        assert f"worker a:CPU started (pid {spare}, the spare process)" in served.output()



@pytest.mark.slow
def test_the_spare_reads_the_models_ahead_and_a_load_takes_its_own(tmp_path, tiny_model):
    a, b = (shutil.copy(tiny_model(), tmp_path / f"{n}.gguf") for n in "ab")
    with serve(tmp_path, "--model", f"a={a}", "--model", f"b={b}", "--max-loaded", "1",
               "--cache-dir", str(tmp_path / "cache")) as served:
        served.wait_service("broker")
        spare = wait_for(lambda: served.state().get("spare_pid"), 60, "a spare process")
        with Client(served.endpoint) as client:
            assert client.complete("hi", model="a", max_tokens=2, timeout=60).usage.completion_tokens == 2
        assert worker_pid(served, "a:CPU") == spare
        assert f"ovpool.worker.opened[{spare}]: model {a}: GGUF header and tokenizer read ahead" \
            in served.output()

def worker_pid(served, name: str) -> int:
    """The worker's pid once serve's state file has it (written a round after the start)."""
    return wait_for(lambda: served.workers().get(name, {}).get("pid"), 60, f"{name}'s pid")


def test_without_a_live_spare_a_worker_starts_plainly():
    spares = SpareWorker(sys.executable, None)
    assert spares.take("a:CPU", [sys.executable, "-m", "ovpool", "worker"]) is None
    spares.keep_one()
    pid = spares.pid
    spares.keep_one()  # one at a time
    assert spares.pid == pid
    spares.close()
    assert spares.pid is None


def test_a_leaving_worker_yields_the_cpu_in_every_thread():
    import os
    import time

    from ovpool.serve.child import ChildProcess

    code = "import threading, time\nfor _ in range(3): threading.Thread(target=time.sleep, args=(9,)).start()"
    with ChildProcess("leaving", [sys.executable, "-c", code]) as child:
        tasks = f"/proc/{child.pid}/task"
        deadline = time.monotonic() + 30
        while len(os.listdir(tasks)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        child.yield_cpu()
        stats = [open(f"{tasks}/{t}/stat").read() for t in os.listdir(tasks)]
        assert [int(s.rsplit(")", 1)[1].split()[16]) for s in stats] == [19] * 4  # field 19: nice


def test_a_spare_starts_after_a_load_once_nothing_runs_or_after_a_while_anyway():
    from ovpool.serve.spare import spare_due

    idle = {"queues": {"a": 0}, "workers": [{"active": 0}]}
    busy = {"queues": {}, "workers": [{"active": 2}]}
    assert not spare_due(5.0, idle) and spare_due(10.0, idle)
    assert not spare_due(20.0, busy) and not spare_due(20.0, None) and spare_due(30.0, busy)
