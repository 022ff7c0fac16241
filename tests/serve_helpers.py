"""Running `ovpool serve` as a real process in tests: start, wait on its state file, find its children."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ovpool.client import Client
from ovpool.serve.child import terminate
from ovpool.testing.pool import free_endpoint

# Fast heartbeats make backoff, readiness and expiry quick (every timing constant derives from it).
FAST_ENV = {"OVPOOL_HEARTBEAT_INTERVAL_S": "0.2", "OVPOOL_LOG_LEVEL": "INFO"}


def free_port() -> int:
    """A loopback port free a moment ago, below the ephemeral range (free_endpoint says why)."""
    return int(free_endpoint().rsplit(":", 1)[1])


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    """A port another server listens (and answers) on while the block runs."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[-1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return {p for p in found if alive(p)}


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample at ``/metrics`` as {(name, sorted labels): value}, parsed as Prometheus does."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, what: str = "a condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Served:
    """A running `ovpool serve`; its merged output goes to ``log``."""

    def __init__(self, proc: subprocess.Popen, state_file: Path, endpoint: str, log: Path,
                 http_port: int | None = None, own_broker: bool = True):
        self.proc, self.state_file, self.endpoint, self.log = proc, state_file, endpoint, log
        self.http_port, self.own_broker = http_port, own_broker

    def state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {"workers": []}

    def workers(self) -> dict[str, dict]:
        return {w["name"]: w for w in self.state()["workers"]}

    def wait_states(self, want: dict[str, str] | str, timeout: float = 60) -> dict[str, dict]:
        def check():
            workers = self.workers()
            states = {n: w["state"] for n, w in workers.items()}
            ok = (set(states.values()) == {want} if isinstance(want, str) else
                  all(states.get(n) == s for n, s in want.items()))
            return workers if workers and ok else None

        return wait_for(check, timeout, f"workers {want} (log:\n{self.output()[-3000:]})")

    def wait_service(self, name: str, timeout: float = 30) -> dict:
        """Serve's entry for its ``broker`` or ``http`` child once that one is ready."""
        return wait_for(lambda: (e := self.state().get(name)) and e["state"] == "ready" and e, timeout,
                        f"the {name} child to be ready (log:\n{self.output()[-3000:]})")

    def client_keys(self) -> dict[str, str]:
        """The pool's client key files, as serve's state file names them ({} when open)."""
        published = wait_for(lambda: "client_keys" in (s := self.state()) and s, 30, "serve's state file")
        return published["client_keys"]

    def client(self, **settings: object) -> Client:
        """A Client of the pool with its client keys (none when open), once serve's own broker
        listens: a client's first request waits only connect_timeout_s (2 s) for it, less than a
        loaded host may take to start it."""
        if self.own_broker:
            self.wait_service("broker")
        return Client(self.endpoint, settings={**self.client_keys(), **settings})

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def run_serve(*args: str, env: dict[str, str] | None = None,
              timeout: float = 60) -> subprocess.CompletedProcess:
    """``ovpool serve ARGS`` run to its end, its output merged into stdout."""
    return subprocess.run([sys.executable, "-m", "ovpool", "serve", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout,
                          env={**os.environ, **FAST_ENV, **(env or {})})


@contextlib.contextmanager
def serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None, http: bool = False,
          closed: bool = False) -> Iterator[Served]:
    """``ovpool serve ARGS``; with ``http`` its HTTP API on a free port, else --no-http. ``closed``:
    serve's default, its own CURVE keys (connect with ``Served.client``); else --open, so plain
    clients connect."""
    port, http_port = free_port(), free_port() if http else None
    state_file, log = tmp_path / "serve.json", tmp_path / "serve.log"
    argv = [sys.executable, "-m", "ovpool", "serve", "--bind", f"tcp://127.0.0.1:{port}",
            "--state-file", str(state_file), *([] if closed else ["--open"]),
            *(["--http", f"127.0.0.1:{http_port}"] if http else ["--no-http"]), *args]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **FAST_ENV, **(env or {})})
    try:
        yield Served(proc, state_file, f"tcp://127.0.0.1:{port}", log, http_port, "--broker" not in args)
    finally:
        terminate(proc, grace_s=15)


def unsupported_model(path: Path) -> Path:
    """A well-formed GGUF of an architecture ovpool does not handle."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
