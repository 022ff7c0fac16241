"""The HTTP API child of ``ovpool serve``: restarted like a worker, by a Supervisor of its own.

It is ready once its port accepts a connection. One that keeps failing at start (a taken port,
say) ends serve with its own error line, like a broker that cannot start: an HTTP API that
never comes up is not a pool anyone can use.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from ovpool.errors import ConfigError
from ovpool.serve.child import ChildProcess
from ovpool.serve.supervisor import RestartPolicy, Supervisor, WorkerPhase

log = logging.getLogger(__name__)
NAME = "http"


class HttpChild:
    """``poll(now)`` on every supervision round; ``stop()`` when serve stops."""

    def __init__(self, argv: list[str], bind: str, env: dict[str, str] | None, policy: RestartPolicy,
                 connect: Callable[[str], bool] | None = None):
        self._argv, self._bind, self._env = argv, bind, env
        self.supervisor = Supervisor({NAME: bind}, policy)
        self._child: ChildProcess | None = None
        self._connect = connect or _accepts

    def poll(self, now: float) -> None:
        self._reap(now)
        if self.supervisor.due(now):
            self._child = ChildProcess(NAME, self._argv, env=self._env).__enter__()
            self.supervisor.started(NAME, self._child.pid, now)
        elif (self._child is not None and self.supervisor.state(NAME) is WorkerPhase.STARTING
              and self._connect(self._bind)):
            self.supervisor.ready(NAME)
            log.info("HTTP API ready on http://%s/v1", self._bind)

    def _reap(self, now: float) -> None:
        if self._child is None or (code := self._child.poll()) is None:
            return
        self._child.stop()
        reason = self._child.last_error()
        self._child = None
        if self.supervisor.exited(NAME, code, now, reason) is WorkerPhase.FAILING:
            raise ConfigError(f"the HTTP API on {self._bind} keeps failing: {reason or f'status {code}'}")
        log.warning("the HTTP API exited with status %d; restarting in %.1f s", code,
                    self.supervisor.restart_at(NAME) - now)

    def stop(self) -> None:
        self.supervisor.stop()
        if self._child is not None:
            self.supervisor.exited(NAME, self._child.stop(), 0.0)
            self._child = None

    def describe(self) -> dict:
        return {**self.supervisor.describe(NAME), "bind": self._bind}


def _accepts(bind: str) -> bool:
    host, _, port = bind.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=0.2):
            return True
    except OSError:
        return False
