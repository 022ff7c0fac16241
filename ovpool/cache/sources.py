"""``source_identity=content``: a GGUF is identified by the sha256 of its bytes, not by its inode.

Hashing reads the whole file, so it is done once per file identity (st_dev, st_ino, size,
mtime_ns, ctime_ns) and remembered in ``<cache_dir>/v1/sources.json``. A cache populated on one
host then follows the model to another path or host: the first start there hashes the file once
(even in cache-only mode; that is one sequential read, far cheaper than a compile), later starts
find the hash by identity and read no weight byte.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from ovpool import json_files
from ovpool.cache.fingerprint import stat_identity
from ovpool.cache.store import CHUNK_BYTES, CacheStore
from ovpool.errors import CacheLockedError

log = logging.getLogger(__name__)
SIDE_FILE = "sources.json"


class ContentHashes:
    """A file's content hash, computed once per file identity and remembered in the cache dir."""

    def __init__(self, store: CacheStore):
        self.store = store
        self.path = store.base / SIDE_FILE

    def __call__(self, path: str | Path) -> str:
        key = _identity_key(path)
        known = self._load().get(key)
        if known:
            return known
        log.info("model cache: hashing %s once (source_identity=content)", path)
        digest = file_sha256(path)
        self._remember(key, digest)
        return digest

    def _load(self) -> dict[str, str]:
        try:
            data = json_files.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _remember(self, key: str, digest: str) -> None:
        try:
            self.store.prepare()
            with self.store.lock("sources"):
                known = self._load()
                known[key] = digest
                self.store.write_text(self.path, json.dumps(known, indent=1, sort_keys=True))
        except (OSError, CacheLockedError) as exc:
            log.warning("model cache: cannot remember the content hash of a model (%s); "
                        "the next start hashes it again", exc)


def _identity_key(path: str | Path) -> str:
    st = stat_identity(path)
    return ":".join(str(st[k]) for k in sorted(st))


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK_BYTES):
            h.update(block)
    return h.hexdigest()
