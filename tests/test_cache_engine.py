"""The cache behind the real Engine: a cache-only start reads no weight page of the GGUF."""

import ctypes
import mmap
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ovpool.cache import prefetch
from ovpool.cache.maintenance import entries
from ovpool.cache.store import CacheStore
from ovpool.errors import CacheMissError
from ovpool.worker.engine import Engine
from ovpool.worker.gguf.model import GGUFModel

_LIBC = ctypes.CDLL(None, use_errno=True)


def resident_pages(path, start: int) -> tuple[int, int]:
    """(resident, total) pages of ``path`` from byte ``start`` to its end, by mincore(2)."""
    data = np.memmap(path, dtype=np.uint8, mode="r")  # mapping faults nothing in
    first = start // mmap.PAGESIZE
    total = -(-data.size // mmap.PAGESIZE) - first
    vec = (ctypes.c_ubyte * total)()
    addr = ctypes.c_void_p(data.ctypes.data + first * mmap.PAGESIZE)
    if _LIBC.mincore(addr, ctypes.c_size_t(total * mmap.PAGESIZE), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return sum(b & 1 for b in vec), total


def evict(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def generate(model, cache_dir, env=None, *flags):
    command = [sys.executable, "-m", "ovpool", "generate", "--model", str(model), "--max-tokens", "6",
               *flags, "The capital of France is"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OVPOOL_CACHE_DIR": str(cache_dir), **(env or {})})
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_cache_only_start_reads_no_weight_page(smollm2_path, tmp_path):
    model = tmp_path / "model.gguf"  # a private copy: nobody else's mapping keeps its pages resident
    shutil.copyfile(smollm2_path, model)
    cache = CacheStore(tmp_path / "cache")
    populated = generate(model, cache.root)
    assert "model cache WROTE" in populated.stderr
    assert len(list(entries(cache))) == 1  # prefill and decode ran on one entry

    weights_start = min(t.offset for t in GGUFModel.open(model).tensors.values())
    evict(model)
    assert resident_pages(model, weights_start)[0] == 0
    cache_only = generate(model, cache.root, {"OVPOOL_CACHE_ONLY": "1"})
    assert "model cache HIT" in cache_only.stderr and cache_only.stdout == populated.stdout
    assert "begun before the lookup" in cache_only.stderr  # `ovpool generate` prefetched the blob
    resident, total = resident_pages(model, weights_start)
    # Reading the header may pull a read-ahead window past its end; nothing more.
    assert resident <= 64 and resident / total < 0.01, (resident, total)


def test_engine_cache_only_names_a_changed_setting(tiny_model, tmp_path):
    model = tiny_model()
    with Engine(model, settings={"kv_cache_precision": "f32"}, cache_dir=tmp_path) as engine:
        assert engine.load_report["outcome"] == "wrote"
        expected = engine.complete("Hello", max_tokens=5).token_ids
    with Engine(model, settings={"kv_cache_precision": "f32"}, cache_dir=tmp_path, cache_only=True) as hit:
        assert hit.load_report["outcome"] == "hit"
        assert hit.complete("Hello", max_tokens=5).token_ids == expected
    with pytest.raises(CacheMissError, match="setting kv_cache_precision: f16 here, f32 in cache"):
        Engine(model, settings={"kv_cache_precision": "f16"}, cache_dir=tmp_path, cache_only=True)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "phi3"])
def test_every_architecture_loads_from_the_cache_with_the_same_tokens(tiny_model, tmp_path, arch):
    model = tiny_model(arch, "Q4_K")
    with Engine(model, cache_dir=tmp_path) as engine:
        assert engine.load_report["outcome"] == "wrote"
        expected = engine.complete("the quick brown fox", max_tokens=12, ignore_eos=True).token_ids
    with Engine(model, cache_dir=tmp_path, cache_only=True) as hit:
        assert hit.load_report["outcome"] == "hit"
        assert hit.complete("the quick brown fox", max_tokens=12, ignore_eos=True).token_ids == expected


def test_engine_takes_over_the_import_begun_from_its_hint(tiny_model, tmp_path):
    model = tiny_model()
    with Engine(model, cache_dir=tmp_path) as engine:
        expected = engine.complete("Hello", max_tokens=5).token_ids
    early = prefetch.start(model, "CPU", {}, tmp_path)  # as `ovpool worker` does before the engine
    assert early is not None
    with Engine(model, cache_dir=tmp_path, early=early) as hit:
        assert hit.load_report["outcome"] == "hit" and hit.compiled is early.result()[0]
        assert hit.complete("Hello", max_tokens=5).token_ids == expected
    assert early.blob is None  # the engine took it over: its mapping went with the engine
    other = tiny_model(weight_type="Q8_0")
    Engine(other, cache_dir=tmp_path).close()
    foreign = prefetch.start(other, "CPU", {}, tmp_path)  # another model's blob: not taken
    with Engine(model, cache_dir=tmp_path, early=foreign) as hit:
        assert hit.load_report["outcome"] == "hit" and hit.load_result.blob is not foreign
        assert foreign.blob is None  # let go of as soon as the load did not take it
        assert hit.complete("Hello", max_tokens=5).token_ids == expected


@pytest.mark.slow
def test_cache_only_batching_graph_reads_no_weight_page_of_the_gguf(smollm2_path, tmp_path):
    from ovpool.worker.backend import EngineBackend

    model = tmp_path / "model.gguf"  # a private copy, as above
    shutil.copyfile(smollm2_path, model)
    with Engine(model, cache_dir=tmp_path / "cache") as engine:  # populates both graphs, as a worker
        assert EngineBackend(engine, slots=2).wait_batching()
    weights_start = min(t.offset for t in GGUFModel.open(model).tensors.values())
    evict(model)
    with Engine(model, cache_dir=tmp_path / "cache", cache_only=True) as engine:
        backend = EngineBackend(engine, slots=2)
        assert backend.wait_batching() and engine.load_report["batching"].startswith("on")
        resident, total = resident_pages(model, weights_start)
    assert resident <= 64 and resident / total < 0.01, (resident, total)
