"""Lookup on its own: which entry serves a fingerprint and its ports, why none does, and what is removed.

Manifests and blobs are written by hand; only the last test imports anything with OpenVINO."""

from __future__ import annotations

import openvino as ov
import pytest

from ovpool.cache.fingerprint import Fingerprint
from ovpool.cache.lookup import Lookup
from ovpool.cache.manifest import Entry, Manifest
from ovpool.cache.store import CacheStore
from ovpool.errors import CacheCorruptError

PARTS = {"architecture": "llama", "setting kv_cache_precision": "f16", "openvino": "2026.4",
         "device type": "CPU"}


def port(name: str, shape: str, direction: str = "in") -> dict[str, str]:
    return {"name": name, "element_type": "i64", "partial_shape": shape, "direction": direction}


PORTS = [port("input_ids", "[?,?]"), port("logits", "[?,?,32]", "out")]


@pytest.fixture
def store(tmp_path):
    cache = CacheStore(tmp_path / "cache")
    cache.prepare()
    return cache


def lookup(store: CacheStore, parts=None, ports=PORTS) -> Lookup:
    return Lookup(store, Fingerprint(dict(parts or PARTS), ("model.gguf",)), ports)


def entry(look: Lookup, ports=PORTS, openvino="2026.4", size=16, suffix="a") -> Entry:
    return Entry(f"{look.family}-{suffix}", list(ports), f"{look.family}-{suffix}.blob", size,
                 "crc32:00000000", openvino, "CPU", 1.0)


def commit(store: CacheStore, look: Lookup, *entries: Entry, parts=None) -> None:
    store.commit(Manifest(look.family, dict(parts or PARTS), ["model.gguf"], {e.id: e for e in entries}))
    for e in entries:
        store.write_blob(e.blob, [b"x" * e.size])


def test_an_empty_cache_says_it_has_no_entries(store):
    assert lookup(store).find() == (None, f"the cache at {store.root} has no entries")


def test_another_family_is_named_by_the_parts_that_differ(store):
    other = {**PARTS, "setting kv_cache_precision": "u8"}
    theirs = lookup(store, other)
    commit(store, theirs, entry(theirs), parts=other)
    found, why = lookup(store).find()
    assert found is None and why == ("no entry with this fingerprint; the nearest differs in "
                                     "setting kv_cache_precision: f16 here, u8 in cache")


def test_an_entry_whose_shapes_cover_the_ports_serves_them_and_narrower_ones_do_not(store):
    look = lookup(store, ports=[port("input_ids", "[1,1..64]"), PORTS[1]])
    commit(store, look, entry(look, ports=PORTS))
    found, why = look.find()
    assert found is not None and found.ports == PORTS and why == ""
    commit(store, look, entry(look, ports=[port("input_ids", "[1,?]"), PORTS[1]]))  # replaces it
    wide = lookup(store, ports=[port("input_ids", "[?,1..64]"), PORTS[1]])
    found, why = wide.find()
    assert found is None and why == ("no entry covers these ports; port input_ids: i64[?,1..64] here, "
                                     "i64[1,?] in cache")


def test_the_exact_entry_wins_over_one_that_merely_covers(store):
    narrow_ports = [port("input_ids", "[1,?]"), PORTS[1]]
    look = lookup(store, ports=narrow_ports)
    commit(store, look, entry(look, ports=PORTS, suffix="wide"),
           entry(look, ports=narrow_ports, suffix="exact"))
    assert look.find()[0].id.endswith("-exact")


def test_an_entry_of_another_openvino_is_corrupt_and_removed_unless_asked_not_to(store):
    look = lookup(store)
    stale = entry(look, openvino="2025.1")
    commit(store, look, stale)
    with pytest.raises(CacheCorruptError, match="compiled by OpenVINO 2025.1 for CPU, this is 2026.4"):
        look.find(repair=False)
    assert store.manifest(look.family).entries == {stale.id: stale}
    with pytest.raises(CacheCorruptError):
        look.find()
    assert store.manifest(look.family) is None and not store.blob_path(stale).exists()


def test_an_unreadable_manifest_is_removed_with_its_blobs(store):
    look = lookup(store)
    commit(store, look, entry(look))
    store.manifest_path(look.family).write_text("{ torn")
    with pytest.raises(CacheCorruptError, match="unreadable"):
        look.find()
    assert not store.manifest_path(look.family).exists() and list(store.blobs_dir.iterdir()) == []


def test_a_blob_that_does_not_import_is_corrupt_and_its_entry_removed(store):
    look = lookup(store)
    junk = entry(look)
    commit(store, look, junk)
    with pytest.raises(CacheCorruptError, match="cannot import blob"):
        look.import_entry(ov.Core(), junk, "CPU", {})
    assert store.manifest(look.family) is None and not store.blob_path(junk).exists()
    missing = entry(look, suffix="gone")
    commit(store, look, missing)
    store.blob_path(missing).unlink()
    with pytest.raises(CacheCorruptError, match="is missing"):
        look.import_entry(ov.Core(), missing, "CPU", {})
    assert store.manifest(look.family) is None
