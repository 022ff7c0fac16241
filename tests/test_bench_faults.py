"""`ovpool bench` on a bad day, with real processes: a pool process stopped (SIGSTOP) or killed
(kill -9) while the pool starts, a broker that is connected but hung, and a scenario script that
stops or hangs, each end the wait at once with an error naming the process and its log, instead
of the 15-minute cold-start bound (or for ever, for the scripts)."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from ovpool import errors
from ovpool.bench import sweep
from ovpool.bench.scripts import run_script
from ovpool.client import Client
from ovpool.testing.pool import PoolProcess, fast_heartbeats, free_endpoint, wait_for_workers

pytestmark = pytest.mark.slow  # processes

_PROMPT_S = 30.0  # far below the 900 s a cold start may take; the cleanup's grace included


def _child_of_ours(command: str) -> int | None:
    """The pid of this process's child ``python -m ovpool <command> ...``, if one runs."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = stat.read_text().rpartition(")")[2].split()[1]
            argv = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if ppid == str(os.getpid()) and argv[1:4] == [b"-m", b"ovpool", command.encode()]:
            return int(stat.parent.name)
    return None


def _signal_when_started(command: str, sig: signal.Signals, hit: list[int]) -> threading.Thread:
    """A thread that sends ``sig`` to the child ``command`` as soon as it exists (it is starting)."""
    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if (pid := _child_of_ours(command)) is not None:
                os.kill(pid, sig)
                hit.append(pid)
                return
            time.sleep(0.01)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("command, sig, lost, how", [
    ("broker", signal.SIGSTOP, errors.BrokerLostError,
     "is stopped (SIGSTOP or a debugger; `kill -CONT {pid}`"),
    ("worker", signal.SIGKILL, errors.WorkerLostError, "was killed by signal 9"),
])
def test_a_pool_process_stopped_or_killed_during_start_up_ends_the_bench_wait_at_once(
        tiny_model, tmp_path, command, sig, lost, how):
    model, log, hit = str(tiny_model(arch="llama", weight_type="Q8_0")), tmp_path / "pool.log", []
    watcher = _signal_when_started(command, sig, hit)
    started = time.monotonic()
    with pytest.raises(lost) as caught, sweep.pool(model, slots=2, log=log):
        pass
    seconds = time.monotonic() - started
    watcher.join()
    assert hit, f"no `ovpool {command}` child was seen"
    assert str(caught.value).startswith(f"`ovpool {command}` (pid {hit[0]}) {how.format(pid=hit[0])}")
    assert str(caught.value).endswith(f"; see {log}: the pool cannot serve without it")
    assert seconds < _PROMPT_S
    assert _child_of_ours("broker") is None and _child_of_ours("worker") is None  # none left behind


def test_a_connected_but_hung_broker_ends_the_wait_naming_it(tmp_path):
    """Hung, not stopped: its process runs and took the connection, but answers nothing. (A
    stand-in: a bare ROUTER socket in a process named as the pool's broker.)"""
    endpoint, log = free_endpoint(), tmp_path / "pool.log"
    silent = PoolProcess("broker", log=log)
    silent.args = ["-c", textwrap.dedent(f"""
        import time, zmq
        sock = zmq.Context().socket(zmq.ROUTER)
        sock.bind({endpoint!r})
        time.sleep(600)
    """)]
    with fast_heartbeats(0.2), silent, Client(endpoint) as client:  # silent for 6 s = lost
        started = time.monotonic()
        with pytest.raises(errors.BrokerLostError) as caught:
            wait_for_workers(client, 1, timeout=300, processes=[silent])
        seconds = time.monotonic() - started
    assert str(caught.value).startswith(f"`ovpool broker` (pid {silent.proc.pid}) runs but stopped"
                                        f" answering; see {log}: the broker at {endpoint} is connected")
    assert seconds < _PROMPT_S


def _script(tmp_path: Path, body: str) -> Path:
    """A stand-in benchmark script; it writes its child's pid to child.pid once that one runs."""
    path = tmp_path / "bench_script.py"
    path.write_text(textwrap.dedent(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(tmp_path / "child.pid")!r}, "w").write(str(child.pid))
    """) + textwrap.dedent(body))
    return path


def _pid_when_written(path: Path) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if path.is_file() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{path} was never written")


def _ended(pid: int) -> bool:
    """Whether ``pid`` is gone (or a zombie: killed, not yet reaped) within a few seconds."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_a_scenario_script_whose_child_is_stopped_fails_at_once_naming_it(tmp_path):
    path = _script(tmp_path, """
        print("started", file=sys.stderr, flush=True)
        child.wait()
    """)
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(run_script(path, limit_s=300)))
    started = time.monotonic()
    runner.start()
    child = _pid_when_written(tmp_path / "child.pid")
    os.kill(child, signal.SIGSTOP)
    runner.join(60)
    assert not runner.is_alive() and time.monotonic() - started < _PROMPT_S
    assert result["failed"].startswith(f"benchmarks/bench_script.py was ended: its process {child}"
                                       f" ({sys.executable} -c import time; time.sleep(600)) is stopped")
    assert result["failed"].endswith("its last output: started\n")
    assert _ended(child)


def test_a_scenario_script_past_its_limit_is_ended_with_everything_it_started(tmp_path):
    path = _script(tmp_path, "child.wait()\n")
    started = time.monotonic()
    result = run_script(path, limit_s=2)
    seconds = time.monotonic() - started
    child = int((tmp_path / "child.pid").read_text())
    assert result == {"failed": "benchmarks/bench_script.py was ended: it ran past its limit of 2 s"
                                " (hung?); its last output: "}
    assert 2 <= seconds < _PROMPT_S
    assert _ended(child)


@pytest.mark.parametrize("body, failed", [
    ("print('no json here')\n", "benchmarks/bench_script.py printed no JSON: 'no json here\\n' "),
    ("sys.exit('it broke')\n", "exit 1: it broke\n"),
])
def test_a_scenario_script_that_fails_is_a_result_not_a_traceback(tmp_path, body, failed):
    assert run_script(_script(tmp_path, body), limit_s=60) == {"failed": failed}
