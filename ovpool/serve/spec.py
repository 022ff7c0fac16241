"""What ``ovpool serve`` runs, as data: the device list, the cache dir, each child's command line.

Pure functions, so the command lines serve would run can be checked without starting anything.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from urllib.parse import urlsplit

from ovpool.broker.residents import NEVER, ModelPolicy
from ovpool.errors import ConfigError
from ovpool.serve.catalog import ModelEntry
from ovpool.settings import API, BROKER, CLIENT, GRAPH, WORKER, lookup

DEFAULT_MODEL = "smollm2"
DEFAULT_BIND = "tcp://127.0.0.1:5555"
DEFAULT_HTTP = "127.0.0.1:8000"
_WILDCARD_HOSTS = {"*", "0.0.0.0", "::", "[::]"}
# The settings each child reads: the HTTP API is also a client of the broker.
CHILD_SCOPES = {"broker": (BROKER,), "worker": (WORKER, GRAPH), "api": (API, CLIENT)}


def parse_devices(devices: str | None, workers: int | None, available: list[str] | None = None) -> list[str]:
    """One entry per worker: ``--devices CPU,GPU.0`` as given, ``--workers N`` as N CPUs.

    ``auto`` is every GPU OpenVINO lists (``available``), or one CPU worker when there is none.
    """
    if devices and workers:
        raise ConfigError("pass --devices or --workers, not both (--workers N starts N CPU workers)")
    if workers is not None:
        if workers < 1:
            raise ConfigError(f"--workers {workers}: need at least 1 worker")
        return ["CPU"] * workers
    if not devices:
        return ["CPU"]
    if devices.strip().lower() == "auto":
        gpus = [d for d in (available or []) if d.startswith("GPU")]
        return gpus or ["CPU"]
    listed = [d.strip() for d in devices.split(",")]
    if not all(listed):
        raise ConfigError(f"--devices {devices!r}: empty device name; e.g. --devices CPU,GPU.0,GPU.1")
    return listed


def worker_names(devices: list[str]) -> dict[str, str]:
    """Worker name -> device: the device itself when unique, else ``CPU#0``, ``CPU#1``, ..."""
    names = {}
    for i, device in enumerate(devices):
        names[f"{device}#{devices[:i].count(device)}" if devices.count(device) > 1 else device] = device
    return names


def scoped(assignments: tuple[str, ...], child: str) -> list[str]:
    """``--set NAME=VALUE`` arguments for the settings among ``assignments`` that ``child`` reads."""
    scopes = CHILD_SCOPES[child]
    return [arg for item in assignments
            if set(lookup(item.partition("=")[0]).scopes) & set(scopes) for arg in ("--set", item)]


def connect_address(bind: str) -> str:
    """Where local workers and clients connect for a broker bound to ``bind`` (wildcards: loopback)."""
    parts = urlsplit(bind)
    if parts.scheme != "tcp" or not parts.port:
        return bind
    host = parts.hostname or "*"
    if host in _WILDCARD_HOSTS or parts.netloc.startswith("*"):
        host = "[::1]" if host in {"::", "[::]"} else "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"tcp://{host}:{parts.port}"


@dataclass(frozen=True)
class PoolSpec:
    """One host's pool. ``bind`` None: no local broker, workers join the broker at ``broker``.
    ``models``: its catalog (serve/catalog.py); one model is always loaded, several are loaded on
    demand within ``max_loaded`` (None: no budget) and unload after their keep-alive."""

    models: tuple[ModelEntry, ...] = (ModelEntry(DEFAULT_MODEL, DEFAULT_MODEL),)
    max_loaded: int | None = None
    keep_alive_s: float = 300.0
    max_loaded_mb: float | None = None  # per device, the workers' PSS (None: no byte budget)
    spare_worker: bool = True  # several models: a worker process started ahead (serve/spare.py)
    devices: tuple[str, ...] = ("CPU",)
    bind: str | None = DEFAULT_BIND
    broker: str = ""
    cache_dir: str = ""  # "": the workers run without a cache
    cache_only: bool = False
    slots: int | None = None
    assignments: tuple[str, ...] = ()
    metrics_port: int = 0
    backend: str = "engine"
    served_names: tuple[str, ...] = ()  # names the workers answer to (default: the model's own)
    token_delay: float = 0.0  # seconds per step of the null backend
    http: str | None = None  # HOST:PORT of the HTTP API child (None: none)
    python: str = sys.executable

    @property
    def model(self) -> str:
        """The model of a one-model pool (the first of several), as given."""
        return self.models[0].source

    @property
    def on_demand(self) -> bool:
        """Whether models load on demand (several models), or the one model runs from the start."""
        return len(self.models) > 1

    def workers(self) -> dict[str, tuple[ModelEntry, str]]:
        """Worker name -> (its model, its device): the devices' names (worker_names) for one
        model, ``MODEL:DEVICE`` for several."""
        if not self.on_demand:
            return {name: (self.models[0], d) for name, d in worker_names(list(self.devices)).items()}
        return {f"{m.name}:{name}": (m, d) for m in self.models
                for name, d in worker_names(list(m.devices or self.devices)).items()}

    def policies(self) -> list[ModelPolicy]:
        """The residency policy of each model (one model alone is pinned: always loaded)."""
        if not self.on_demand:
            return [ModelPolicy(self.models[0].name, NEVER, pinned=True)]
        return [m.policy(self.keep_alive_s, self.devices) for m in self.models]

    @property
    def endpoint(self) -> str:
        """The broker address workers and clients use."""
        return self.broker or connect_address(self.bind or DEFAULT_BIND)

    def broker_argv(self) -> list[str]:
        argv = [self.python, "-m", "ovpool", "broker", "--bind", self.bind or DEFAULT_BIND]
        argv += ["--metrics-port", str(self.metrics_port)] if self.metrics_port else []
        return argv + scoped(self.assignments, "broker")

    def worker_argv(self, name: str, device: str, model: ModelEntry | None = None) -> list[str]:
        model = model or self.models[0]
        argv = [self.python, "-m", "ovpool", "worker", "--broker", self.endpoint, "--model", model.source,
                "--device", device, "--name", name, "--backend", self.backend]
        argv += ["--cache-dir", self.cache_dir] if self.cache_dir else ["--no-cache"]
        if self.cache_only:
            argv.append("--cache-only")
        slots = model.slots or self.slots
        if slots is not None:
            argv += ["--slots", str(slots)]
        # Several models: each answers to its catalog name (what /v1/models lists) and its own.
        names = (model.name, *model.served_names) if self.on_demand else self.served_names
        for served in names:
            argv += ["--served-name", served]
        if self.token_delay:
            argv += ["--token-delay", str(self.token_delay)]
        return argv + scoped(self.assignments, "worker")

    def api_argv(self) -> list[str]:
        """The HTTP API child (its keys travel in the environment, not on a command line)."""
        return [self.python, "-m", "ovpool", "api", "--broker", self.endpoint, "--bind", self.http or "",
                *scoped(self.assignments, "api")]
