"""Real broker and worker processes for tests and benchmarks (``python -m ovpool ...``)."""

from __future__ import annotations

import contextlib
import importlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from ovpool import errors, timing
from ovpool.client import Client
from ovpool.serve.child import terminate
from ovpool.settings import child_environment, set_variable


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
    """A loopback tcp endpoint whose port was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


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

    def exited(self) -> str | None:
        """How this process ended, in words (None while it runs)."""
        code = self.proc.poll() if self.proc is not None else None
        if code is None:
            return None
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        where = f"; see {self.log}" if self.log else ""
        return f"`ovpool {self.command}` (pid {self.proc.pid}) {how}{where}"


def check_running(processes: Iterable[PoolProcess]) -> None:
    """Raise, naming it, if one of ``processes`` has ended: a pool's wait must not outlast its
    broker (BrokerLostError) or a worker it waits for (WorkerLostError)."""
    for process in processes:
        if (why := process.exited()) is not None:
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
    once the error of check_running should one of the pool's ``processes`` end first."""
    deadline = time.monotonic() + timeout
    seen = "no broker"
    while time.monotonic() < deadline:
        check_running(processes)
        try:
            status = client.status(timeout=timeout)
        except errors.BrokerUnavailableError:  # still starting (a loaded machine can take seconds)
            continue
        if len(status["workers"]) == count:
            return status
        seen = f"{len(status['workers'])} workers"
        time.sleep(0.05)
    raise TimeoutError(f"{seen} registered after {timeout}s, expected {count}")
