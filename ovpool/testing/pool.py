"""Real broker and worker processes for tests and benchmarks (``python -m ovpool ...``)."""

from __future__ import annotations

import contextlib
import importlib
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from ovpool import errors, proc_state, timing
from ovpool.client import Client
from ovpool.serve.child import terminate
from ovpool.settings import child_environment, set_variable

BROKER_START_S = 60.0  # a broker loads no model: seconds to answer, even on a loaded host


@contextlib.contextmanager
def fast_heartbeats(interval_s: float):
    """Run this process and the children it starts with a short heartbeat interval."""
    old = set_variable("OVPOOL_HEARTBEAT_INTERVAL_S", str(interval_s))
    importlib.reload(timing)  # every user reads timing.X at call time, so this applies at once
    try:
        yield
    finally:
        set_variable("OVPOOL_HEARTBEAT_INTERVAL_S", old)
        importlib.reload(timing)


def free_endpoint() -> str:
    """A loopback tcp endpoint whose port was free a moment ago, drawn below the kernel's
    ephemeral range: a port of that range may become the local port of any connection made on the
    host before the child binds it (a test that opens hundreds), and the child's bind then fails."""
    low = _ephemeral_low()
    draw = random.SystemRandom()  # not `random`: test processes side by side may share its seed
    for _ in range(100):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", draw.randrange(max(1024, low - 16384), low)))
            except OSError:  # taken: draw again
                continue
            return f"tcp://127.0.0.1:{s.getsockname()[1]}"
    with socket.socket() as s:  # the range below is crowded: an ephemeral one, as before
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


class PoolProcess:
    """One ``ovpool`` subcommand as a child process; stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, log: Path | None = None):
        self.command = args[0]  # the subcommand: broker, worker, api...
        self.args = ["-m", "ovpool", *args]
        self.env = child_environment(env)
        self.log = log
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> PoolProcess:
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen([sys.executable, *self.args], env=self.env, stdout=out, stderr=out)
        if self.log:
            out.close()  # the child holds its own descriptor
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not exit in ``timeout``. Returns the exit status."""
        return terminate(self.proc, timeout)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def trouble(self) -> str | None:
        """Why this process will not answer, in words: it ended, or it is stopped (None while it runs)."""
        if self.proc is None:
            return None
        if (code := self.proc.poll()) is not None:
            how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        elif proc_state.stopped(self.proc.pid):
            how = f"is stopped (SIGSTOP or a debugger; `kill -CONT {self.proc.pid}` resumes it)"
        else:
            return None
        return f"{self.name()} {how}{self.where()}"

    def name(self) -> str:
        return f"`ovpool {self.command}` (pid {self.proc.pid if self.proc else '-'})"

    def where(self) -> str:
        return f"; see {self.log}" if self.log else ""


def check_running(processes: Iterable[PoolProcess]) -> None:
    """Raise, naming it, if one of ``processes`` has ended or is stopped: a pool's wait must not
    outlast its broker (BrokerLostError) or a worker it waits for (WorkerLostError)."""
    for process in processes:
        if (why := process.trouble()) is not None:
            lost = errors.BrokerLostError if process.command == "broker" else errors.WorkerLostError
            raise lost(f"{why}: the pool cannot serve without it")


def broker(endpoint: str, *extra: str, env: dict[str, str] | None = None,
           log: Path | None = None) -> PoolProcess:
    return PoolProcess("broker", "--bind", endpoint, *extra, env=env, log=log)


def null_worker(endpoint: str, *, model: str = "null", slots: int = 4, token_delay: float = 0.0,
                extra: tuple[str, ...] = (), env: dict[str, str] | None = None,
                log: Path | None = None) -> PoolProcess:
    return PoolProcess("worker", "--broker", endpoint, "--backend", "null", "--model", model,
                       "--slots", str(slots), "--token-delay", str(token_delay), *extra, env=env, log=log)


def wait_for_workers(client: Client, count: int, timeout: float = 20.0,
                     processes: Iterable[PoolProcess] = ()) -> dict:
    """The broker's status once ``count`` workers are registered; TimeoutError otherwise, and at
    once the error of check_running should one of the pool's ``processes`` end or stop first.
    A broker among them must answer within BROKER_START_S and stay answering (_broker_silent)."""
    processes = list(processes)
    started = time.monotonic()
    deadline = started + timeout
    seen = "no broker"
    while time.monotonic() < deadline:
        check_running(processes)
        try:
            status = client.status(timeout=min(timeout, BROKER_START_S))
        except errors.BrokerUnavailableError as exc:
            _broker_silent(exc, processes, time.monotonic() - started)
            continue
        if len(status["workers"]) == count:
            return status
        seen = f"{len(status['workers'])} workers"
        time.sleep(0.05)
    logs = sorted({str(p.log) for p in processes if p.log})
    raise TimeoutError(f"{seen} registered after {timeout}s, expected {count}"
                       + (f" (see {', '.join(logs)})" if logs else ""))


def _broker_silent(exc: errors.BrokerUnavailableError, processes: list[PoolProcess], waited_s: float) -> None:
    """Return if the broker may still be starting. Raise, naming our broker process and its log,
    once it is running but lost (connected, then silent: hung) or never answered in BROKER_START_S.
    Without our broker among ``processes`` one elsewhere may be restarting: only the timeout ends it."""
    check_running(processes)  # an ended or stopped process says best what is wrong
    ours = next((p for p in processes if p.command == "broker"), None)
    if ours is None:
        return
    if isinstance(exc, errors.BrokerLostError):
        raise errors.BrokerLostError(f"{ours.name()} runs but stopped answering{ours.where()}: {exc}")
    if waited_s >= BROKER_START_S:
        raise errors.BrokerUnavailableError(
            f"{ours.name()} runs but has not answered in {waited_s:.0f} s (it loads no model, so it is"
            f" hung){ours.where()}: {exc}")
