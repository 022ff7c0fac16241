"""The paged graph's KV blocks grow without copying when they need not: a grow to the blocks
already held keeps them (a copy writes every page of them: an engine's first single stream wrote
all of kv_cache_mb, SmolLM2's 256 MiB of zeros, and peaked at twice that); a real grow keeps the
blocks' contents."""

import ctypes
import mmap

import numpy as np

from ovpool.worker.engine import Engine
from ovpool.worker.generate.batch import Chunk, PagedRunner

_LIBC = ctypes.CDLL(None, use_errno=True)


def resident_pages(memory: np.ndarray) -> int:
    """Pages of ``memory`` (page-aligned) resident in this process, by mincore(2)."""
    pages = -(-memory.nbytes // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    assert _LIBC.mincore(ctypes.c_void_p(memory.ctypes.data), ctypes.c_size_t(memory.nbytes), vec) == 0
    return sum(b & 1 for b in vec)


def address(runner: PagedRunner) -> int:
    return runner.requests[0].get_tensor("key_cache.0").data.ctypes.data


def test_a_grow_to_the_blocks_held_or_fewer_keeps_them(tiny_model):
    with Engine(tiny_model(), cache_dir="") as engine:
        assert engine.attention == "paged"
        runner = PagedRunner(engine.compiled, num_blocks=8)
        before = address(runner)
        runner.grow(8)
        runner.grow(4)
        assert (runner.num_blocks, address(runner)) == (8, before)
        runner.write_block(3, np.arange(runner.block_bytes, dtype=np.uint8).tobytes())
        kept = runner.read_block(3)
        runner.grow(16)  # a real grow: new memory, the blocks' contents kept
        assert runner.num_blocks == 16 and address(runner) != before
        assert runner.read_block(3) == kept and not np.frombuffer(runner.read_block(12), np.uint8).any()


def test_a_grow_copies_only_the_blocks_written(tiny_model):
    with Engine(tiny_model(), cache_dir="") as engine:
        runner = PagedRunner(engine.compiled, num_blocks=64)
        runner.forward([Chunk("a", 0, [3, 4, 5], [0], sample=True)])  # writes block 0 only
        kept = runner.read_block(0)
        runner.grow(128)
        memory = runner._memory  # the new blocks' pages: a copied block is a written page
        assert runner.read_block(0) == kept and np.frombuffer(kept, np.uint8).any()
        assert resident_pages(memory) <= 2 * len(runner._layout) * -(-runner.block_bytes // mmap.PAGESIZE)
