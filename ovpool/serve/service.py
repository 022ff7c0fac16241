"""One service child of ``ovpool serve`` (the broker, the HTTP API): restarted like a worker, by a
Supervisor of its own.

It is ready once ``ready(pid)`` says so: for a TCP service, once the socket listening on its port
is the child's own (ports.owns_listener), so another server answering there is never taken for
it. One that keeps failing at start ends serve with its own error line: a broker or HTTP API that
never comes up is not a pool anyone can use. One that crashes later is restarted; clients and
workers reconnect to a restarted broker, and clients resend what it forgot (ovpool.pending).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ovpool.errors import ConfigError
from ovpool.serve import ports
from ovpool.serve.child import ChildProcess
from ovpool.serve.supervisor import RestartPolicy, Supervisor, WorkerPhase

log = logging.getLogger(__name__)


class Service:
    """``poll(now)`` on every supervision round; ``stop()`` when serve stops.

    ``what`` names it in messages ("the broker on tcp://..."); ``ready(pid)`` tells whether the
    child ``pid`` serves (default: it owns the listener on ``address``'s TCP port)."""

    def __init__(self, name: str, what: str, argv: list[str], address: str, env: dict[str, str] | None,
                 policy: RestartPolicy, ready: Callable[[int], bool] | None = None):
        self.name, self.what, self.address = name, what, address
        self._argv, self._env = argv, env
        self.supervisor = Supervisor({name: address}, policy)
        self._child: ChildProcess | None = None
        self._ready = ready or _listens_on(address)

    @property
    def ready(self) -> bool:
        return self.supervisor.state(self.name) is WorkerPhase.READY

    def poll(self, now: float) -> None:
        self._reap(now)
        if self.supervisor.due(now):
            self._child = ChildProcess(self.name, self._argv, env=self._env).__enter__()
            self.supervisor.started(self.name, self._child.pid, now)
            if self.supervisor.describe(self.name)["restarts"]:
                log.warning("%s restarted (pid %d)", self.what, self._child.pid)
        elif (self._child is not None and self.supervisor.state(self.name) is WorkerPhase.STARTING
              and self._ready(self._child.pid)):
            self.supervisor.ready(self.name)
            log.info("%s ready", self.what)

    def _reap(self, now: float) -> None:
        if self._child is None or (code := self._child.poll()) is None:
            return
        self._child.stop()
        reason = self._child.last_error()
        self._child = None
        if self.supervisor.exited(self.name, code, now, reason) is WorkerPhase.FAILING:
            raise ConfigError(f"{self.what} keeps failing: {reason or f'status {code}'}")
        log.warning("%s exited with status %d; restarting in %.1f s", self.what, code,
                    self.supervisor.restart_at(self.name) - now)

    def stop(self) -> None:
        self.supervisor.stop()
        if self._child is not None:
            self.supervisor.exited(self.name, self._child.stop(), 0.0)
            self._child = None

    def describe(self) -> dict:
        return {**self.supervisor.describe(self.name), "address": self.address}


def _listens_on(address: str) -> Callable[[int], bool]:
    port = ports.tcp_port(address)
    if port is None:  # ipc://, inproc://: the child is taken as ready once it runs
        return lambda pid: True
    return lambda pid: ports.owns_listener(pid, port)
