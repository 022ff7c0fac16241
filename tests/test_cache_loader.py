"""load_compiled against a toy graph: hits, misses, cache-only mode and every fault."""

import contextlib
import inspect
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import cache_toy
import numpy as np
import openvino as ov
import pytest

from ovpool.cache import maintenance
from ovpool.cache.loader import DecodeHandle, Owner, load_compiled
from ovpool.cache.store import CacheStore
from ovpool.errors import CacheCorruptError, CacheMissError, CacheUnsupportedError
from ovpool.worker.graph.arena import ConstantArena
from ovpool.worker.graph.decode import DecodeGraph

CORE = ov.Core()
EXPECTED = cache_toy.run(CORE.compile_model(cache_toy.build(), "CPU"))


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "toy.gguf"
    path.write_bytes(os.urandom(8192))
    return path


@pytest.fixture
def cache(tmp_path):
    return CacheStore(tmp_path / "cache")


def load(cache_dir, model_file, *, cache_only=False, settings=None, device="CPU", builds=None,
         **port_flags):
    builds = [] if builds is None else builds
    return load_compiled(CORE, identity=cache_toy.identity(model_file, settings, **port_flags),
                         device=device, config={},
                         build=lambda: cache_toy.build(calls=builds, **port_flags),
                         cache_dir=cache_dir, cache_only=cache_only)


def only_entry(cache):
    [manifest] = cache.readable_manifests()
    [entry] = manifest.entries.values()
    return manifest, entry


def test_miss_writes_then_hit_imports_without_building(cache, model_file, caplog):
    caplog.set_level(logging.INFO, "ovpool.cache")
    first = load(cache.root, model_file)
    assert first.outcome == "wrote"
    builds = []
    second = load(cache.root, model_file, builds=builds)
    assert (second.outcome, second.entry, builds) == ("hit", first.entry, [])
    np.testing.assert_array_equal(cache_toy.run(second.compiled), EXPECTED)
    family = first.entry.split("-")[0]
    assert f"model cache MISS {family}: " in caplog.text
    assert f"model cache WROTE {first.entry}" in caplog.text
    assert f"model cache HIT {first.entry}" in caplog.text
    assert list(cache.tmp_dir.iterdir()) == []


def test_each_hit_is_counted_and_gc_drops_counters_without_an_entry(cache, model_file):
    load(cache.root, model_file)
    _, entry = only_entry(cache)
    assert cache.hits(entry) == 0  # the export is not a hit
    for _ in range(2):
        load(cache.root, model_file)
    stray = cache.hits_path(entry.id.split("-")[0] + "-gone.blob")  # a hit that raced a removal
    stray.write_bytes(b".")
    maintenance.gc(cache)
    assert cache.hits(entry) == 2 and not stray.exists()


def test_without_a_cache_dir_it_compiles_and_cache_only_needs_one(model_file):
    assert load(None, model_file).outcome == "compiled"
    with pytest.raises(CacheUnsupportedError, match="cache-only mode needs a cache directory"):
        load(None, model_file, cache_only=True)


def test_cache_only_miss_names_the_difference_and_never_builds(cache, model_file):
    load(cache.root, model_file)
    builds = []
    with pytest.raises(CacheMissError) as err:
        load(cache.root, model_file, cache_only=True, settings={"kv_cache_precision": "u8"}, builds=builds)
    assert "setting kv_cache_precision: u8 here, f16 in cache" in str(err.value)
    assert "without cache-only" in str(err.value) and builds == []
    assert load(cache.root, model_file, cache_only=True).outcome == "hit"


def test_cache_only_on_an_empty_cache_says_so(cache, model_file):
    with pytest.raises(CacheMissError, match="has no entries"):
        load(cache.root, model_file, cache_only=True)


@pytest.mark.parametrize("device,kwargs,needle", [
    ("HETERO:CPU", {}, "CPU fallback"), ("AUTO", {}, "CPU fallback"), ("CPU", {"static": True}, "static"),
])
def test_cache_only_refuses_what_cannot_avoid_compiling(cache, model_file, device, kwargs, needle):
    with pytest.raises(CacheUnsupportedError, match=needle):
        load(cache.root, model_file, cache_only=True, device=device, **kwargs)


def test_static_graph_without_cache_only_compiles_uncached(cache, model_file, caplog):
    assert load(cache.root, model_file, static=True).outcome == "compiled"
    assert "not used: static-shape" in caplog.text and cache.families() == []


def test_prefill_and_decode_share_an_entry_other_ports_get_their_own(cache, model_file):
    dynamic = load(cache.root, model_file)
    narrow = cache_toy.identity(model_file)
    narrow = type(narrow)(**{**vars(narrow), "ports": [
        {**p, "partial_shape": p["partial_shape"].replace("[?,?", "[1,?")} for p in narrow.ports]})
    hit = load_compiled(CORE, identity=narrow, device="CPU", config={}, build=cache_toy.build,
                        cache_dir=cache.root, cache_only=True)
    assert hit.entry == dynamic.entry
    other = load(cache.root, model_file, extra=True)
    assert other.outcome == "wrote" and other.entry != dynamic.entry
    [manifest] = cache.readable_manifests()
    assert set(manifest.entries) == {dynamic.entry, other.entry}
    assert load(cache.root, model_file, extra=True, cache_only=True).entry == other.entry


def flip_middle_bit(cache, entry):
    path = cache.blob_path(entry)
    data = bytearray(path.read_bytes())
    data[len(data) * 3 // 4] ^= 0x10  # inside the weights, past the XML that import parses
    path.write_bytes(data)


def truncate(cache, entry):
    path = cache.blob_path(entry)
    path.write_bytes(path.read_bytes()[: entry.size // 2])


def garbage_manifest(cache, entry):
    cache.manifest_path(entry.id.split("-")[0]).write_text("{ not json")


def other_openvino(cache, entry):
    path = cache.manifest_path(entry.id.split("-")[0])
    path.write_text(path.read_text().replace(entry.openvino, "2023.0.0-old"))


def missing_blob(cache, entry):
    cache.blob_path(entry).unlink()


def port_not_a_shape(cache, entry):
    """Valid JSON, a port row lookups cannot parse (this used to escape as an AttributeError)."""
    path = cache.manifest_path(entry.id.split("-")[0])
    doc = json.loads(path.read_text())
    doc["entries"][entry.id]["ports"][0]["partial_shape"] = None
    path.write_text(json.dumps(doc))


FAULTS = [flip_middle_bit, truncate, garbage_manifest, other_openvino, missing_blob, port_not_a_shape]


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.__name__)
def test_a_bad_entry_is_a_miss_removed_and_rewritten(cache, model_file, fault, caplog):
    load(cache.root, model_file)
    load(cache.root, model_file)  # a hit on the entry that goes bad
    fault(cache, only_entry(cache)[1])
    again = load(cache.root, model_file)
    assert again.outcome == "wrote"
    assert "model cache: removing" in caplog.text
    np.testing.assert_array_equal(cache_toy.run(again.compiled), EXPECTED)
    assert load(cache.root, model_file).outcome == "hit"
    assert len(list(cache.blobs_dir.iterdir())) == 1
    assert cache.hits(only_entry(cache)[1]) == 1  # the bad entry's hit went with it


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.__name__)
def test_a_bad_entry_in_cache_only_mode_is_an_error_and_removed(cache, model_file, fault):
    load(cache.root, model_file)
    fault(cache, only_entry(cache)[1])
    with pytest.raises(CacheCorruptError, match="without cache-only"):
        load(cache.root, model_file, cache_only=True)
    assert cache.families() == [] and list(cache.blobs_dir.iterdir()) == []


def test_touched_gguf_no_longer_hits(cache, model_file):
    load(cache.root, model_file)
    os.utime(model_file)
    with pytest.raises(CacheMissError, match="model\\[0\\] st_mtime_ns"):
        load(cache.root, model_file, cache_only=True)


@contextlib.contextmanager
def mounted(source, target, *options):
    subprocess.run(["mount", *options, source, str(target)], check=True, capture_output=True)
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


@contextlib.contextmanager
def read_only(path: Path):
    """``path`` read-only for this process: a read-only bind mount as root, else no write bits."""
    if os.geteuid() == 0:
        with mounted(str(path), path, "--bind"):
            subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)
            yield
        return
    modes = {p: p.stat().st_mode for p in [path, *path.rglob("*")]}
    for p in modes:
        p.chmod(modes[p] & ~0o222)
    try:
        yield
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


def test_read_only_cache_dir_hits_and_skips_exports(cache, model_file, caplog):
    written = load(cache.root, model_file)
    with read_only(cache.root):
        assert load(cache.root, model_file).entry == written.entry
        other = load(cache.root, model_file, extra=True)
    assert other.outcome == "compiled" and "not writable" in caplog.text
    np.testing.assert_array_equal(cache_toy.run(other.compiled, extra=True),
                                  cache_toy.run(CORE.compile_model(cache_toy.build(extra=True), "CPU"),
                                                extra=True))


def export_on_a_full_disk(cache_dir: Path, child: list[str]) -> subprocess.CompletedProcess:
    """Run ``child`` exporting into a 16 KiB tmpfs (the toy blob is ~22 KiB) where we may mount
    one, else under a 16 KiB RLIMIT_FSIZE (writes past it fail with EFBIG instead of ENOSPC)."""
    if os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs",
                                             str(cache_dir)], capture_output=True).returncode == 0:
        try:
            return subprocess.run(child, capture_output=True, text=True, timeout=120)
        finally:
            assert [p.name for p in cache_dir.rglob("*") if p.is_file() and p.suffix != ".lock"] == []
            subprocess.run(["umount", str(cache_dir)], check=True)
    limit = "import resource,signal,sys,runpy;signal.signal(signal.SIGXFSZ,signal.SIG_IGN);" \
            "resource.setrlimit(resource.RLIMIT_FSIZE,(16384,16384));sys.argv=sys.argv[1:];" \
            "runpy.run_path(sys.argv[0],run_name='__main__')"
    return subprocess.run([child[0], "-c", limit, *child[1:]], capture_output=True, text=True, timeout=120)


def test_disk_full_during_export_leaves_nothing_and_goes_on(tmp_path, model_file):
    cache_dir = tmp_path / "small"
    cache_dir.mkdir()
    out = export_on_a_full_disk(cache_dir, [sys.executable, cache_toy.__file__, str(cache_dir),
                                            str(model_file)])
    assert out.returncode == 0, out.stderr
    assert "export failed" in out.stderr
    assert out.stdout.split() == ["RESULT", "compiled", "None", cache_toy.digest(EXPECTED)]
    assert [p.name for p in cache_dir.rglob("*") if p.is_file() and p.suffix != ".lock"] == []


def test_manifest_records_what_ls_needs(cache, model_file):
    load(cache.root, model_file)
    manifest, entry = only_entry(cache)
    raw = json.loads(cache.manifest_path(manifest.family).read_text())
    assert raw["models"] == [str(model_file)] and raw["schema"] == 1
    assert entry.size == cache.blob_path(entry).stat().st_size and entry.checksum.startswith("crc32:")


@pytest.mark.parametrize("protocol, worker_type", [(DecodeHandle, DecodeGraph), (Owner, ConstantArena)])
def test_the_worker_objects_a_load_result_carries_have_what_it_declares(protocol, worker_type):
    # The cache names the worker's types by protocol only (it must not import the worker): checked here.
    members = [name for name in vars(protocol) if not name.startswith("_")]
    assert members
    for name in members:
        declared, actual = (inspect.signature(getattr(t, name)).parameters for t in (protocol, worker_type))
        assert [(p.name, p.default) for p in actual.values()] == \
            [(p.name, p.default) for p in declared.values()], f"{worker_type.__name__}.{name}"
