"""The paged graph's KV blocks grow without copying when they need not: a grow to the blocks
already held keeps them (a copy writes every page of them: an engine's first single stream wrote
all of kv_cache_mb, SmolLM2's 256 MiB of zeros, and peaked at twice that); a real grow keeps the
blocks' contents."""

import numpy as np

from ovpool.worker.engine import Engine
from ovpool.worker.generate.batch import PagedRunner


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
