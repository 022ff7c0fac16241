"""What identifies a compiled graph in the cache, computed without reading a weight byte.

A fingerprint is a flat, ordered mapping of named parts to short strings, e.g.
``{"model[0] st_ino": "1234", "setting kv_cache_precision": "f16", "openvino": "2026.4.1", ...}``.
The family hash covers every part; ports and shape bounds are not parts, they select an entry
inside a family. Named parts let a miss say exactly what differs from the nearest entry.

Parts, in order: source identity of each GGUF (st_dev, st_ino, size, mtime_ns, ctime_ns, or with
``source_identity=content`` the sha256 of its bytes), a hash of its tensor descriptors, the
architecture, every hparam, the graph builder's source hash, every effective graph setting, the
compile config, the OpenVINO version, the device type and architecture (not its index: GPU.0
and GPU.1 share blobs), and for an entry that is not a compiled model, its form (``cached form``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ovpool.devices import device_type

if TYPE_CHECKING:  # `ovpool cache ls` reads stat identities without importing OpenVINO
    import openvino as ov

Descriptor = tuple[str, str, tuple[int, ...], int]  # (name, ggml type name, shape, offset)
_STAT_FIELDS = ("st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns")
# CPU features a compiled CPU blob may depend on; DEVICE_ARCHITECTURE is only "intel64" there.
_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni", "amx_tile",
              "amx_bf16", "amx_int8", "fma", "f16c")


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


@dataclass(frozen=True)
class GraphIdentity:
    """Everything about a graph the engine knows before building it (contract 6).

    ``sources``: one (path, descriptors) pair per GGUF file. ``ports``: graph.port_spec(...).
    ``settings``: effective graph settings with 'auto' already resolved.
    """

    sources: Sequence[tuple[str, Sequence[Descriptor]]]
    architecture: str
    hparams: Mapping[str, Any]
    builder_hash: str
    ports: Sequence[Mapping[str, str]]
    settings: Mapping[str, Any]
    source_identity: str = "metadata"

    def __post_init__(self) -> None:
        hparams = asdict(self.hparams) if is_dataclass(self.hparams) else dict(self.hparams)
        object.__setattr__(self, "hparams", hparams)
        object.__setattr__(self, "ports", tuple(dict(p) for p in self.ports))
        object.__setattr__(self, "sources", tuple((str(p), tuple(map(tuple, d))) for p, d in self.sources))
        object.__setattr__(self, "settings", dict(self.settings))

    def __hash__(self) -> int:
        return hash(_frozen([self.sources, self.hparams, self.ports, self.settings, self.architecture,
                             self.builder_hash, self.source_identity]))

    @classmethod
    def from_model(cls, model: Any, *, ports: Sequence[Mapping[str, str]], builder_hash: str,
                   settings: Mapping[str, Any], source_identity: str = "metadata") -> GraphIdentity:
        """From a GGUFModel (contract 2): reads its header data only, never a weight byte."""
        descriptors = [(t.name, t.ggml_type.name, tuple(int(d) for d in t.shape), int(t.offset))
                       for t in model.tensors.values()]
        return cls(sources=[(str(model.path), descriptors)], architecture=model.architecture,
                   hparams=model.hparams, builder_hash=builder_hash, ports=ports,
                   settings=settings, source_identity=source_identity)


@dataclass(frozen=True)
class DeviceKey:
    """A device as the cache sees it: type and architecture, never the index."""

    type: str
    architecture: str

    @classmethod
    def probe(cls, core: ov.Core, device: str) -> DeviceKey:
        dtype = device_type(device)
        try:
            arch = str(core.get_property(device, "DEVICE_ARCHITECTURE"))
        except RuntimeError:
            arch = str(core.get_property(device, "FULL_DEVICE_NAME"))
        if dtype == "CPU":
            arch += " " + "+".join(_cpu_flags())
        return cls(dtype, arch)


def _cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    present = set(line.partition(":")[2].split())
    return [f for f in _CPU_FLAGS if f in present]


def openvino_version() -> str:
    import openvino as ov

    return ov.get_version()


def stat_identity(path: str | Path) -> dict[str, int]:
    st = os.stat(path)
    return {name: int(getattr(st, name)) for name in _STAT_FIELDS}


def descriptors_hash(descriptors: Sequence[Descriptor]) -> str:
    return _digest(json.dumps([list(map(_jsonable, d)) for d in descriptors]))


@dataclass(frozen=True)
class Fingerprint:
    """The named parts of one graph's fingerprint, its family hash and its model file paths."""

    parts: Mapping[str, str]
    models: tuple[str, ...]

    @property
    def family(self) -> str:
        return _digest(json.dumps(list(self.parts.items())))[:24]


def fingerprint(identity: GraphIdentity, device: DeviceKey, config: Mapping[str, Any], *,
                ov_version: str, content_hash: Callable[[str], str] | None = None,
                form: str | None = None) -> Fingerprint:
    """Parts of ``identity`` on ``device`` compiled with ``config``.

    ``content_hash(path)`` gives a file's sha256 for ``source_identity=content``; only file stats and
    the given descriptors are used otherwise. ``form``: what the entry keeps when not the compiled
    model (a part of its own, so such entries are a family apart: ovpool.cache.ir).
    """
    parts: dict[str, str] = {}
    for i, (path, descriptors) in enumerate(identity.sources):
        if identity.source_identity == "content":
            if content_hash is None:
                raise ValueError("source_identity=content needs a content_hash function")
            parts[f"model[{i}] sha256"] = content_hash(path)
        else:
            for name, value in stat_identity(path).items():
                parts[f"model[{i}] {name}"] = str(value)
        parts[f"model[{i}] tensors"] = descriptors_hash(descriptors)
    parts["architecture"] = identity.architecture
    parts.update({f"hparam {k}": _text(v) for k, v in sorted(identity.hparams.items())})
    parts["graph builder"] = identity.builder_hash
    parts.update({f"setting {k}": _text(v) for k, v in sorted(identity.settings.items())})
    parts.update({f"compile config {k}": _text(v) for k, v in sorted(config.items())})
    parts["openvino"] = ov_version
    parts["device type"] = device.type
    parts["device architecture"] = device.architecture
    if form is not None:
        parts["cached form"] = form
    return Fingerprint(parts, tuple(p for p, _ in identity.sources))


def ports_key(ports: Sequence[Mapping[str, str]]) -> str:
    """A short hash of a port list, independent of its order."""
    rows = sorted(json.dumps(dict(sorted(p.items()))) for p in ports)
    return _digest(json.dumps(rows))[:12]


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
