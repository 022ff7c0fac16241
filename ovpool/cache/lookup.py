"""Finding, importing and dropping cache entries for one fingerprint.

A hit imports the blob through a copy-on-write memmap (``ov.Tensor(..., shared_memory=True)``), so
its pages stay clean and shared between workers through the page cache, while a second thread
computes the blob's crc32 (ovpool.cache.prefetch.BlobImport; the import may have begun before the
lookup). The compiled model is used only if both the import and the checksum succeed: a truncated
or bit-flipped blob is a miss, never wrong output.
An unusable entry or manifest is removed under the family lock, after checking that it is still
the same one (another process may have replaced it meanwhile).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import openvino as ov

from ovpool.cache.fingerprint import (
    DeviceKey,
    Fingerprint,
    GraphIdentity,
    fingerprint,
    openvino_version,
)
from ovpool.cache.manifest import Entry, Manifest, nearest, parse_bounds
from ovpool.cache.prefetch import BlobImport
from ovpool.cache.sources import ContentHashes
from ovpool.cache.store import CacheStore
from ovpool.errors import CacheCorruptError, CacheLockedError

log = logging.getLogger("ovpool.cache")


class Lookup:
    """The cache as seen by one graph: ``fp`` on ``device``, with ``ports``."""

    def __init__(self, store: CacheStore, fp: Fingerprint, ports: Sequence[Mapping[str, str]]):
        self.store, self.fp, self.ports = store, fp, list(ports)
        self.family = fp.family

    @classmethod
    def create(cls, core: ov.Core, cache_dir: str | Path, identity: GraphIdentity, device: str,
               config: Mapping[str, Any], lock_timeout_s: float = -1, form: str | None = None) -> Lookup:
        """The lookup for ``identity`` compiled for ``device`` with ``config``; its locks wait at most
        ``lock_timeout_s`` (< 0: for ever); ``form``: see fingerprint."""
        store = CacheStore(cache_dir, lock_timeout_s)
        content = ContentHashes(store) if identity.source_identity == "content" else None
        fp = fingerprint(identity, DeviceKey.probe(core, device), config, ov_version=openvino_version(),
                         content_hash=content, form=form)
        return cls(store, fp, identity.ports)

    def find(self, repair: bool = True) -> tuple[Entry | None, str]:
        """The usable entry, or None and why not. A bad manifest or entry raises CacheCorruptError
        and, with ``repair``, is removed."""
        try:
            manifest = self.store.manifest(self.family)
        except CacheCorruptError:
            if repair:
                self.drop_family()
            raise
        if manifest is None:
            return None, self.no_family_reason()
        entry = manifest.find(self.ports)
        if entry is None:
            return None, _ports_reason(manifest, self.ports)
        if entry.openvino != self.fp.parts["openvino"] or entry.device != self.fp.parts["device type"]:
            if repair:
                self.drop(entry)
            raise CacheCorruptError(f"entry {entry.id} was compiled by OpenVINO {entry.openvino} for "
                                    f"{entry.device}, this is {self.fp.parts['openvino']} on "
                                    f"{self.fp.parts['device type']}")
        return entry, ""

    def no_family_reason(self) -> str:
        manifest, diffs = nearest(self.fp.parts, self.store.readable_manifests())
        if manifest is None:
            return f"the cache at {self.store.root} has no entries"
        shown = "; ".join(diffs[:6]) + (f"; and {len(diffs) - 6} more" if len(diffs) > 6 else "")
        same_file = _same_file_elsewhere(self.fp, manifest)
        return f"{same_file or 'no entry with this fingerprint'}; the nearest differs in {shown}"

    def import_entry(self, core: ov.Core, entry: Entry, device: str, config: dict,
                     early: BlobImport | None = None) -> tuple[ov.CompiledModel, BlobImport]:
        """Import and verify ``entry``: (compiled model, the import that maps its blob, to be
        kept open while the model is used). ``early`` is taken over if it is this blob's import
        (see ovpool.cache.prefetch); an unusable blob is dropped and raises CacheCorruptError."""
        path = self.store.blob_path(entry)
        taken = early is not None and early.serves(path, entry.size, device, config)
        blob = early if taken else None
        try:
            if taken:
                log.info("model cache: import of %s begun before the lookup", entry.blob)
            else:
                self.store.check_blob(entry)
                blob = BlobImport(core, path, device, config)
            compiled, checksum = blob.result()
            if checksum != entry.checksum:
                raise CacheCorruptError(f"blob {entry.blob} fails its checksum (expected "
                                        f"{entry.checksum}, found {checksum})")
        except CacheCorruptError:
            if blob is not None and not taken:
                blob.close()
            self.drop(entry)
            raise
        self.store.record_hit(entry)
        return compiled, blob

    def drop(self, entry: Entry) -> None:
        log.warning("model cache: removing unusable entry %s", entry.id)
        self._under_lock(lambda: self.store.drop_entry(self.family, entry.id, expected=entry))

    def drop_family(self) -> None:
        log.warning("model cache: removing unreadable manifest of family %s", self.family)

        def remove_if_still_garbage() -> None:
            try:
                self.store.manifest(self.family)
            except CacheCorruptError:
                self.store.drop_family(self.family)

        self._under_lock(remove_if_still_garbage)

    def _under_lock(self, action) -> None:
        try:
            self.store.prepare()
            with self.store.lock(self.family):
                action()
        except (OSError, CacheLockedError) as exc:
            log.warning("model cache: cannot remove a bad entry from %s (%s); it stays a miss",
                        self.store.root, exc)


# Parts that only say which file on disk a model is (not what it holds): a copy of the same GGUF
# elsewhere (another venv's wheel) or the same file re-installed differs in these alone.
_FILE_IDENTITY = re.compile(r"model\[\d+\] st_(dev|ino|mtime_ns|ctime_ns)")


def _same_file_elsewhere(fp: Fingerprint, manifest: Manifest) -> str:
    """The plain reason when only the model files' identity differs from ``manifest``, else ""."""
    here, cached = fp.parts, manifest.parts
    differing = {n for n in set(here) | set(cached) if here.get(n) != cached.get(n)}
    if not differing or not all(_FILE_IDENTITY.fullmatch(n) for n in differing):
        return ""
    moved = [f"{mine} here, {theirs} in cache"
             for mine, theirs in zip(fp.models, manifest.models, strict=False) if mine != theirs]
    where = (f"the same model file at another path ({'; '.join(moved)}), e.g. another venv's copy"
             if moved else "the same model file, re-installed or touched since it was cached")
    return (f"{where}: a new entry; use source_identity=content to share one entry between copies "
            "(--set source_identity=content, or OVPOOL_SOURCE_IDENTITY=content)")


def _ports_reason(manifest: Manifest, ports: Sequence[Mapping[str, str]]) -> str:
    mine = {p["name"]: p for p in ports}
    lines = []
    for entry in manifest.entries.values():
        theirs = {p["name"]: p for p in entry.ports}
        for name in sorted(set(mine) | set(theirs)):
            a, b = mine.get(name), theirs.get(name)
            if a is None or b is None:
                lines.append(f"port {name}: {'present' if a else 'absent'} here, "
                             f"{'present' if b else 'absent'} in cache")
            elif (a["element_type"], parse_bounds(a["partial_shape"])) != \
                    (b["element_type"], parse_bounds(b["partial_shape"])):
                lines.append(f"port {name}: {a['element_type']}{a['partial_shape']} here, "
                             f"{b['element_type']}{b['partial_shape']} in cache")
    return "no entry covers these ports; " + "; ".join(dict.fromkeys(lines))
