"""Manifests: one JSON file per graph family, listing its entries (pure logic, no I/O).

An entry records its ports (names, directions, element types, partial shapes = shape bounds), its
blob's name, size and checksum, the OpenVINO version and device it was compiled for, and when it
was created. A lookup returns the entry whose ports match exactly, else one whose names and types
match and whose shape bounds cover the request: prefill and decode of one dynamic graph share an
entry, a graph with other ports gets an exact entry of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ovpool import json_files
from ovpool.errors import CacheCorruptError

SCHEMA = 1
Bounds = list[tuple[int, int | None]] | None  # per dimension (low, high or None); None: any rank
_PORT_KEYS = {"name", "direction", "element_type", "partial_shape"}


@dataclass(frozen=True)
class Entry:
    id: str
    ports: list[dict[str, str]]
    blob: str
    size: int
    checksum: str
    openvino: str
    device: str
    created: float

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Entry:
        """An entry as a manifest file holds it; every field of the wrong type or form (its ports'
        too: lookups compare and parse them) is a TypeError or ValueError."""
        entry = cls(**{k: raw[k] for k in cls.__dataclass_fields__})
        texts = (entry.id, entry.blob, entry.checksum, entry.openvino, entry.device)
        if not (all(isinstance(t, str) for t in texts) and type(entry.size) is int and entry.size > 0
                and isinstance(entry.created, int | float) and isinstance(entry.ports, list)
                and "/" not in entry.blob and entry.blob not in ("", ".", "..")):
            raise TypeError("bad field types")
        for p in entry.ports:
            if not (isinstance(p, dict) and set(p) >= _PORT_KEYS
                    and all(isinstance(v, str) for v in p.values())):
                raise TypeError(f"a port is not a row of {sorted(_PORT_KEYS)} as text: {p!r:.80}")
            parse_bounds(p["partial_shape"])  # ValueError if it is not a shape
        return entry


@dataclass(frozen=True)
class Manifest:
    family: str
    parts: dict[str, str]
    models: list[str]
    entries: dict[str, Entry] = field(default_factory=dict)

    def find(self, ports: Sequence[Mapping[str, str]]) -> Entry | None:
        """The exact entry for ``ports``, else the first whose shape bounds cover them."""
        exact = [e for e in self.entries.values() if _port_rows(e.ports) == _port_rows(ports)]
        if exact:
            return exact[0]
        return next((e for e in self.entries.values() if covers(e.ports, ports)), None)

    def with_entry(self, entry: Entry) -> Manifest:
        return replace(self, entries={**self.entries, entry.id: entry})

    def without(self, entry_id: str) -> Manifest:
        return replace(self, entries={k: v for k, v in self.entries.items() if k != entry_id})

    def to_json(self) -> str:
        body = {"schema": SCHEMA, "family": self.family, "parts": self.parts, "models": self.models,
                "entries": {k: asdict(v) for k, v in self.entries.items()}}
        return json.dumps(body, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, family: str) -> Manifest:
        """Parse a manifest file; anything malformed is a CacheCorruptError."""
        try:
            raw = json_files.loads(text)
            if raw["schema"] != SCHEMA or raw["family"] != family:
                raise ValueError(f"schema {raw['schema']!r} / family {raw['family']!r}")
            entries = {k: Entry.from_dict(v) for k, v in raw["entries"].items()}
            if any(k != e.id for k, e in entries.items()):
                raise ValueError("entry keys differ from their ids")
            return cls(family, dict(raw["parts"]), list(raw["models"]), entries)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CacheCorruptError(f"manifest of family {family} is unreadable: {exc}") from exc


def parse_bounds(partial_shape: str) -> Bounds:
    """``"[?,1..8,64]"`` (OpenVINO's PartialShape text) as [(0, None), (1, 8), (64, 64)]."""
    text = partial_shape.strip()
    if text in ("...", "?", "[...]"):
        return None
    dims = [d.strip() for d in text.strip("[]").split(",") if d.strip()]
    return [_dim_bounds(d) for d in dims]


def _dim_bounds(dim: str) -> tuple[int, int | None]:
    if dim in ("?", "-1"):
        return (0, None)
    if ".." in dim:
        lo, hi = dim.split("..", 1)
        return (int(lo or 0), int(hi) if hi else None)
    return (int(dim), int(dim))


def _covers_dim(have: tuple[int, int | None], want: tuple[int, int | None]) -> bool:
    if want[0] < have[0]:
        return False
    return have[1] is None or (want[1] is not None and want[1] <= have[1])


def covers(have_ports: Sequence[Mapping[str, str]], want_ports: Sequence[Mapping[str, str]]) -> bool:
    """Whether a graph with ``have_ports`` can serve every shape ``want_ports`` allows."""
    have = {(p["name"], p["direction"]): p for p in have_ports}
    if set(have) != {(p["name"], p["direction"]) for p in want_ports}:
        return False
    for want in want_ports:
        got = have[(want["name"], want["direction"])]
        if got["element_type"] != want["element_type"]:
            return False
        hb, wb = parse_bounds(got["partial_shape"]), parse_bounds(want["partial_shape"])
        if hb is None:
            continue
        if wb is None or len(hb) != len(wb) or not all(map(_covers_dim, hb, wb)):
            return False
    return True


def is_static(ports: Iterable[Mapping[str, str]]) -> bool:
    """Whether every input port has a fully static shape (a graph compiled for one shape only)."""
    inputs = [parse_bounds(p["partial_shape"]) for p in ports if p["direction"] == "in"]
    return bool(inputs) and all(b is not None and all(lo == hi for lo, hi in b) for b in inputs)


def _port_rows(ports: Iterable[Mapping[str, str]]) -> list[tuple]:
    return sorted(tuple(sorted(p.items())) for p in ports)


def differences(here: Mapping[str, str], cached: Mapping[str, str]) -> list[str]:
    """Human lines for each part that differs, e.g. "setting kv_cache_precision: u8 here, f16 in cache"."""
    out = []
    for name in list(here) + [n for n in cached if n not in here]:
        mine, theirs = here.get(name, "(absent)"), cached.get(name, "(absent)")
        if mine != theirs:
            out.append(f"{name}: {mine} here, {theirs} in cache")
    return out


def nearest(here: Mapping[str, str], manifests: Iterable[Manifest]) -> tuple[Manifest | None, list[str]]:
    """The manifest whose parts differ from ``here`` in the fewest places, with those differences."""
    best: tuple[Manifest | None, list[str]] = (None, [])
    for manifest in manifests:
        diffs = differences(here, manifest.parts)
        if best[0] is None or len(diffs) < len(best[1]):
            best = (manifest, diffs)
    return best
