"""Real broker and worker processes for tests and benchmarks (``python -m ovpool ...``)."""

from __future__ import annotations

import contextlib
import importlib
import socket
import subprocess
import sys
import time
from pathlib import Path

from ovpool import timing
from ovpool.client import Client
from ovpool.errors import BrokerUnavailableError
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


def broker(endpoint: str, *extra: str, env: dict[str, str] | None = None,
           log: Path | None = None) -> PoolProcess:
    return PoolProcess("broker", "--bind", endpoint, *extra, env=env, log=log)


def null_worker(endpoint: str, *, model: str = "null", slots: int = 4, token_delay: float = 0.0,
                extra: tuple[str, ...] = (), env: dict[str, str] | None = None,
                log: Path | None = None) -> PoolProcess:
    return PoolProcess("worker", "--broker", endpoint, "--backend", "null", "--model", model,
                       "--slots", str(slots), "--token-delay", str(token_delay), *extra, env=env, log=log)


def wait_for_workers(client: Client, count: int, timeout: float = 20.0) -> dict:
    """The broker's status once ``count`` workers are registered; TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    seen = "no broker"
    while time.monotonic() < deadline:
        try:
            status = client.status(timeout=timeout)
        except BrokerUnavailableError:  # still starting (a loaded machine can take seconds)
            continue
        if len(status["workers"]) == count:
            return status
        seen = f"{len(status['workers'])} workers"
        time.sleep(0.05)
    raise TimeoutError(f"{seen} registered after {timeout}s, expected {count}")
