"""The prefix cache's host-RAM tier (ovpool.cache.kv_ram): never over its budget, a block whole or
absent, least recently used out, over the disk tier; and a pool's evicted prefix coming back from it."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st
from test_kv_tier import Blocks, MemoryTier, admit

from ovpool.cache import kv
from ovpool.cache.kv_ram import RamLru, RamTier
from ovpool.cache.store import CacheStore
from ovpool.worker.generate.kv_tier import TierLink
from ovpool.worker.generate.scheduler import Scheduler


class Lower(MemoryTier):
    """A lower tier that counts what it is asked."""

    stats: dict = {}

    def __init__(self):
        super().__init__()
        self.gets = 0

    def get(self, address: bytes, size: int) -> bytes | None:
        self.gets += 1
        return super().get(address, size)

    def flush(self, timeout: float = 30.0) -> None:
        pass

    def close(self) -> None:
        pass


ops = st.lists(st.tuples(st.sampled_from(("put", "get")), st.integers(0, 11), st.integers(0, 255)),
               max_size=80)


@settings(max_examples=200, deadline=None)
@given(budget=st.integers(0, 9 * 64), ops=ops)
def test_the_ram_tier_is_an_lru_within_its_budget_of_whole_blocks(budget, ops):
    ram, model = RamTier(None, budget), OrderedDict()  # the LRU it must be: address -> payload
    slots = budget // 64
    for op, key, fill in ops:
        address = bytes([key]) * 16
        if op == "put":
            payload = bytes([fill]) * 64
            ram.put(address, payload)
            if address not in model:
                model[address] = payload
            model.move_to_end(address)
            while len(model) > slots:
                model.popitem(last=False)
        else:
            got = ram.get(address, 64)
            assert (None if got is None else bytes(got)) == model.get(address)
            if address in model:
                model.move_to_end(address)
        assert ram.stats["ram_bytes"] <= budget and ram.stats["ram_blocks"] == len(model)
    ram.close()


@given(slots=st.integers(0, 6), addresses=st.lists(st.integers(0, 9), max_size=60))
def test_lru_slots_are_never_shared_and_never_more_than_there_are(slots, addresses):
    lru, held = RamLru(slots), {}
    for a in addresses:
        slot = lru.place(bytes([a]))
        if slot is not None:
            held = {k: s for k, s in held.items() if bytes([k]) in lru}
            held[a] = slot
        assert len(lru) <= slots and len(set(held.values())) == len(held)


def test_a_block_of_another_size_is_not_kept_but_written_through():
    lower = Lower()
    with RamTier(lower, 1000) as ram:
        ram.put(b"a", b"x" * 100)
        ram.put(b"b", b"y" * 99)
        assert lower == {b"a": b"x" * 100, b"b": b"y" * 99}
        assert ram.get(b"b", 99) == b"y" * 99 and lower.gets == 1  # from below
        assert bytes(ram.get(b"a", 100)) == b"x" * 100 and lower.gets == 1  # from RAM
        assert ram.stats["ram_blocks"] == 1 and ram.stats["ram_hits"] == 1


def test_a_disk_hit_is_kept_in_ram_and_the_next_read_needs_no_disk(tmp_path):
    with kv.DiskTier(CacheStore(tmp_path), "ns", 1 << 20) as disk:
        disk.put(b"a" * 16, b"x" * 1000)
    with kv.open_tier(tmp_path, "ns-entry", 1, ram_mb=1) as tier:
        assert isinstance(tier, RamTier)
        assert tier.get(b"a" * 16, 1000) == b"x" * 1000 and tier.stats["hits"] == 1
        kv.DiskTier(CacheStore(tmp_path), "ns", 1 << 20).path(b"a" * 16).unlink()
        assert bytes(tier.get(b"a" * 16, 1000)) == b"x" * 1000
        assert tier.stats["ram_hits"] == 1 and tier.stats["hits"] == 1
    assert isinstance(kv.open_tier(tmp_path, "ns-entry", 1, ram_mb=0), kv.DiskTier)


def test_a_prefix_the_pool_evicted_comes_back_from_ram_not_from_below():
    lower, runner = Lower(), Blocks()
    for block in range(8):
        runner.write_block(block, bytes([block]) * 4)
    ram = RamTier(lower, 64 * 4)  # room for 64 blocks of 4 bytes
    s = Scheduler(num_blocks=8, block_size=4, prefill_chunk=64, max_running=4, caching=True,
                  seed=b"graph", tier=TierLink(ram, runner))
    assert admit(s, "a", list(range(17))) == 0  # 4 full prompt blocks, in RAM and below
    s.finish("a")
    assert admit(s, "b", list(range(100, 129))) == 0  # 8 blocks: the pool evicts all of a's
    s.finish("b")
    gets = lower.gets
    assert admit(s, "c", list(range(17)) + [5]) == 16
    assert lower.gets == gets and s.tier.loaded == 4 and ram.stats["ram_hits"] == 4
