"""The environment variables that are not settings (no ``--set``), registered with what reads them,
and the only code besides the settings' own that reads or sets the environment."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ovpool.errors import InvalidSettingError
from ovpool.settings.registry import REGISTRY
from ovpool.settings.setting import API, PROCESS, WORKER


@dataclass(frozen=True)
class Variable:
    """An environment variable that is not a setting (no ``--set``): what reads it, and why."""

    name: str
    scopes: tuple[str, ...]
    default: str
    help: str


_VARIABLES = [
    Variable("OVPOOL_LOG_LEVEL", (PROCESS,), "INFO",
             "log level (as --log-level): DEBUG, INFO, WARNING, ERROR"),
    Variable("OVPOOL_LOG_JSON", (PROCESS,), "off", "log JSON lines instead of text (as --log-json): on/off"),
    Variable("OVPOOL_HEARTBEAT_INTERVAL_S", (PROCESS,), "1.0", "seconds between heartbeats; every timeout "
             "of the pool (liveness, reconnects, supervision) is a multiple of it (tests shorten it)"),
    Variable("OVPOOL_MODEL", (PROCESS,), "smollm2", "the model of `ovpool serve` (as --model)"),
    Variable("OVPOOL_KEEP_UP_ON_WORKER_FAILURE", (PROCESS,), "off",
             "`ovpool serve --keep-up-on-worker-failure`: on/off"),
    Variable("OVPOOL_API_KEY", (API,), "", "Bearer keys the HTTP API requires, comma-separated "
             "(`ovpool api`, `ovpool serve`; serve's workers and broker never see it)"),
    Variable("OVPOOL_HTTP_BIND", (API,), "127.0.0.1:8000", "where `ovpool api` listens (as --bind)"),
    Variable("OVPOOL_CACHE_TEST_PAUSE", (WORKER,), "", "test hook: a cache writer stops at this phase "
             "(blob-write, blob-renamed, manifest-write) until a signal (ovpool/cache/store.py)"),
    Variable("ONEDNN_MAX_CPU_ISA", (PROCESS,), "", "benchmarks: the instruction set oneDNN may use, set by "
             "--isa for the benchmark and its children (ovpool/bench/isa.py)"),
    Variable("OPENBLAS_NUM_THREADS", (PROCESS,), "1", "numpy's BLAS threads: ovpool's commands start "
             "with one unless the environment sets it, so no BLAS thread spins beside a start "
             "(ovpool/startup.py)"),
    Variable("XDG_CACHE_HOME", (PROCESS,), "~/.cache",
             "base of the default cache_dir and of joined model files"),
    Variable("XDG_RUNTIME_DIR", (PROCESS,), "", "where `ovpool serve` keeps its pool's CURVE keys (when this "
             "user's; else the temporary directory)"),
]

VARIABLES: dict[str, Variable] = {v.name: v for v in _VARIABLES}


def variable(name: str, env: Mapping[str, str] | None = None) -> str:
    """The value of the registered environment variable ``name`` ("" when unset)."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not registered in ovpool.settings.VARIABLES")
    return (os.environ if env is None else env).get(name, "")


def set_variable(name: str, value: str | None) -> str | None:
    """Set (None: unset) a registered variable or a setting's OVPOOL_<NAME> for this process and
    the children it starts (benchmarks, tests); the previous value."""
    if name not in VARIABLES and name not in {s.env for s in REGISTRY.values()}:
        raise KeyError(f"{name} is neither a setting's variable nor in ovpool.settings.VARIABLES")
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    return old


def child_environment(extra: Mapping[str, str] | None = None, drop: Iterable[str] = ()) -> dict[str, str]:
    """This process's environment for a child process, with ``extra`` set and ``drop`` removed."""
    base = {k: v for k, v in os.environ.items() if k not in set(drop)}
    return {**base, **(extra or {})}


def heartbeat_interval_s(env: Mapping[str, str] | None = None) -> float:
    """OVPOOL_HEARTBEAT_INTERVAL_S as a positive number; a bad value names the variable."""
    raw = variable("OVPOOL_HEARTBEAT_INTERVAL_S", env) or VARIABLES["OVPOOL_HEARTBEAT_INTERVAL_S"].default
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise InvalidSettingError(f"environment variable OVPOOL_HEARTBEAT_INTERVAL_S={raw!r} is not a "
                                  "positive number of seconds; fix or unset it")
    return value
