"""The models one ``ovpool serve`` can serve: from ``--model NAME[=PATH]`` (repeatable),
``--models-dir DIR`` (every GGUF there by its stem) and ``--models FILE.toml`` (per-model settings).

A models file has one table per model, the table's name being the name clients use::

    [models.chat]
    path = "/models/qwen2.5-1.5b-q4_k_m.gguf"   # or an alias: "smollm2"
    served_names = ["gpt-4o-mini"]              # more names for it
    slots = 4
    devices = ["GPU.0"]                          # default: serve's --devices
    keep_alive = 600                             # seconds idle before it unloads; -1: never
    pinned = true                                # loaded at start, never unloaded

Pure functions apart from reading that file (Python 3.11+: tomllib) and listing that directory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ovpool import bounds
from ovpool.broker.bounds import MAX_SLOTS, is_name
from ovpool.broker.residents import ModelPolicy
from ovpool.errors import ConfigError
from ovpool.models import model_name, models_in

_FIELDS = {"path", "served_names", "slots", "devices", "keep_alive", "pinned"}


@dataclass(frozen=True)
class ModelEntry:
    """One model of the catalog. ``keep_alive_s`` None: the setting keep_alive_s; ``devices`` ():
    the pool's; ``slots`` None: the setting slots."""

    name: str
    source: str
    served_names: tuple[str, ...] = ()
    slots: int | None = None
    devices: tuple[str, ...] = ()
    keep_alive_s: float | None = None
    pinned: bool = False
    # Whether its GGUF has a chat template (the CLI reads the header; serve never imports the
    # worker), so /v1/models can say so before it loads; None: not known.
    chat: bool | None = None

    def policy(self, keep_alive_s: float, devices: tuple[str, ...]) -> ModelPolicy:
        """Its residency policy: ``keep_alive_s`` and ``devices`` are the pool's defaults."""
        keep = self.keep_alive_s if self.keep_alive_s is not None else keep_alive_s
        return ModelPolicy(self.name, keep, self.pinned, tuple(dict.fromkeys(self.devices or devices)))


def catalog(models: tuple[str, ...], models_dir: str | None,
            models_file: str | None) -> tuple[ModelEntry, ...]:
    """Every model from the three sources, in order; ConfigError on a name given twice."""
    entries = [ModelEntry(*model_name(m)) for m in models]
    if models_dir:
        entries += [ModelEntry(name, path) for name, path in models_in(models_dir)]
    if models_file:
        entries += read_models_file(models_file)
    seen: set[str] = set()
    for entry in entries:
        for name in (entry.name, *entry.served_names):
            if name in seen:
                raise ConfigError(f"model name {name!r} is given twice (--model, --models-dir, "
                                  "--models); give each model its own name with --model NAME=PATH")
            seen.add(name)
    return tuple(entries)


def read_models_file(path: str) -> list[ModelEntry]:
    """The ``[models.NAME]`` tables of a TOML file; ConfigError naming the file and the field."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        raise ConfigError("--models needs Python 3.11 or later (tomllib); use --model instead") from None
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"--models {path!r}: cannot read it ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--models {path!r} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # tomllib decodes the whole file first
        raise ConfigError(f"--models {path!r} is not valid TOML: not UTF-8 text (byte {exc.start})") from None
    tables = doc.get("models")
    if not isinstance(tables, dict) or not tables:
        raise ConfigError(f"--models {path!r} has no [models.NAME] table; see docs/operations.md, "
                          "Many models")
    return [_entry(path, name, table, Path(path).parent) for name, table in tables.items()]


def _entry(path: str, name: str, table: object, base: Path) -> ModelEntry:
    where = f"--models {path!r}, [models.{name}]"
    if not isinstance(table, dict) or not isinstance(table.get("path"), str):
        raise ConfigError(f"{where}: needs path = \"FILE.gguf\" (or an alias such as \"smollm2\")")
    unknown = set(table) - _FIELDS
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}; known: "
                          f"{', '.join(sorted(_FIELDS))}")
    source = table["path"]
    if "/" in source and not Path(source).expanduser().is_absolute():
        source = str(base / source)  # relative to the models file, not to where serve runs
    pinned = table.get("pinned", False)
    try:
        if not is_name(name):
            raise ValueError(f"the model's name must be 1 to {bounds.MAX_NAME_CHARS} characters, "
                             f"not {len(name):,}")
        if type(pinned) is not bool:
            raise TypeError(f"pinned must be true or false, not {pinned!r}")
        served_names = _strings(table, "served_names")
        if not all(is_name(v) for v in served_names):
            raise ValueError(f"served_names must each be 1 to {bounds.MAX_NAME_CHARS} characters")
        return ModelEntry(name, source, served_names=tuple(served_names),
                          slots=_number(table, "slots", int, 1, MAX_SLOTS),
                          devices=tuple(_strings(table, "devices")),
                          keep_alive_s=_number(table, "keep_alive", float, -1),
                          pinned=pinned)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _strings(table: dict, key: str) -> list[str]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise TypeError(f"{key} must be a list of names")
    return value


def _number(table: dict, key: str, kind: type, minimum: float,
            maximum: float = math.inf) -> float | int | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not minimum <= value <= maximum:
        most = f" and <= {maximum:g}" if math.isfinite(maximum) else ""
        raise ValueError(f"{key} must be a number >= {minimum:g}{most}, not {value!r}")
    return kind(value)
