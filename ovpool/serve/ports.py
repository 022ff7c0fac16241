"""Serve's port checks: a taken port fails serve before any child starts, and a child is ready
only once the listening socket on its port is its own (not whatever else answers there).

Ownership comes from the kernel (/proc/net/tcp* lists each LISTEN socket's inode, /proc/PID/fd
links name the inodes a process holds): a connect alone is answered by any server on the port.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import zmq

from ovpool.errors import ConfigError

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column
_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def check_http(bind: str) -> None:
    """ConfigError naming ``bind`` unless the HTTP API could listen there now."""
    from ovpool.api.server import listen  # the child's own bind, so the check is the same

    listen(bind).close()


def check_broker(bind: str) -> None:
    """ConfigError naming ``bind`` unless a broker could bind it now (bound the way the broker
    binds, by ZeroMQ, then released)."""
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    sock.linger = 0
    try:
        sock.bind(bind)
    except zmq.ZMQError as exc:
        raise ConfigError(f"the broker cannot bind {bind}: {os.strerror(exc.errno)}; is another broker or "
                          "`ovpool serve` running there? Pick another --bind") from None
    finally:
        sock.close()
        context.term()  # waits until the listener is closed, so the broker child can take it


def tcp_port(bind: str) -> int | None:
    """The TCP port of a ZeroMQ endpoint (``tcp://host:port``) or an HTTP ``HOST:PORT``; else None."""
    if "://" in bind:
        parts = urlsplit(bind)
        return parts.port if parts.scheme == "tcp" else None
    port = bind.rpartition(":")[2]
    return int(port) if port.isdigit() else None


def owns_listener(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a socket listening on TCP ``port`` (any address)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone
        return False
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            return True
    return False


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in _TABLES:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()  # sl local_address rem_address st ... uid timeout inode
            if len(fields) > 9 and fields[3] == _LISTEN and int(fields[1].rpartition(":")[2], 16) == port:
                inodes.add(fields[9])
    return inodes
