"""The prefix cache's disk tier (ovpool.cache.kv, ovpool.worker.generate.kv_tier): block files
that are whole or a miss, its budget, and worker processes that restart, share and recover."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_cache_loader import read_only

from ovpool.cache import kv, maintenance
from ovpool.cache.store import PAUSE_ENV, CacheStore
from ovpool.worker.generate.kv_tier import TierLink
from ovpool.worker.generate.scheduler import Scheduler

CHILD = Path(__file__).with_name("kv_tier_child.py")
PROMPT = 200  # tokens: 6 full blocks of 32 (the tiny model's context is 256)


def tier(tmp_path, budget: int = 1 << 20) -> kv.DiskTier:
    return kv.DiskTier(CacheStore(tmp_path), "ns", budget)


def test_a_block_file_round_trips_and_a_damaged_one_is_a_miss_and_removed(tmp_path):
    with tier(tmp_path) as t:
        t.put(b"a" * 16, b"x" * 1000)
        t.put(b"b" * 16, b"y" * 1000)
        t.flush()
    assert t.get(b"a" * 16, 1000) == b"x" * 1000
    truncated, flipped = t.path(b"a" * 16), t.path(b"b" * 16)
    truncated.write_bytes(truncated.read_bytes()[:-1])
    data = bytearray(flipped.read_bytes())
    data[500] ^= 1
    flipped.write_bytes(bytes(data))
    assert t.get(b"a" * 16, 1000) is None and t.get(b"b" * 16, 1000) is None
    assert t.get(b"c" * 16, 1000) is None
    assert not truncated.exists() and not flipped.exists()
    assert t.stats["corrupt"] == 2 and not list((tmp_path / "v1" / "tmp").iterdir())


def _bytes_read() -> int:
    """What this process has read through read(2) and its kin so far (the kernel's count)."""
    line = next(x for x in Path("/proc/self/io").read_text().splitlines() if x.startswith("rchar:"))
    return int(line.split()[1])


def test_a_file_that_is_no_block_of_the_size_is_a_miss_and_never_read_whole(tmp_path):
    with tier(tmp_path) as t:
        t.put(b"a" * 16, b"x" * 1000)
        t.flush()
    t.dir.mkdir(parents=True, exist_ok=True)
    oversized, wrong = t.path(b"o" * 16), t.path(b"w" * 16)
    with open(oversized, "wb") as f:  # sparse: 8 GiB that a whole read would allocate
        f.truncate(8 << 30)
    wrong.write_bytes(t.path(b"a" * 16).read_bytes()[:-10] + bytes(20))
    zero, fifo = t.path(b"z" * 16), t.path(b"f" * 16)
    zero.symlink_to("/dev/zero")
    os.mkfifo(fifo)
    read_before = _bytes_read()
    for address in (b"o", b"w", b"z", b"f"):
        assert t.get(address * 16, 1000) is None
    assert _bytes_read() - read_before < 1 << 20  # not the 8 GiB nor /dev/zero's endless bytes
    assert not oversized.exists() and not wrong.exists() and t.stats["corrupt"] == 2
    assert zero.is_symlink() and fifo.exists() and t.stats["misses"] == 2  # not a block: left alone
    assert t.get(b"a" * 16, 1000) == b"x" * 1000
    results = {r["block"].split("/")[1][:2]: r for r in kv.check(t.dir.parent)}
    assert results[zero.name[:2]]["problem"] == results[fifo.name[:2]]["problem"] == "not a regular file"
    assert results[t.path(b"a" * 16).name[:2]]["ok"] and len(results) == 3


def test_cache_verify_and_ls_know_the_kv_tier(tmp_path):
    with tier(tmp_path) as t:
        for i in range(3):
            t.put(bytes([i]) * 16, b"x" * 1000)
    data = bytearray(t.path(bytes([1]) * 16).read_bytes())
    data[100] ^= 4
    t.path(bytes([1]) * 16).write_bytes(bytes(data))
    cmd = [sys.executable, "-m", "ovpool", "cache", "verify", "--cache-dir", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 1 and f"BAD ns/{bytes([1]).hex() * 16}.kv" in out.stdout
    assert out.stdout.splitlines()[-1] == "0 of 0 ok, 2 of 3 KV blocks ok"
    listed = subprocess.run([*cmd[:4], "ls", *cmd[5:]], capture_output=True, text=True, check=True).stdout
    assert "KV tier 0.0 MiB in 3 blocks, of 1024.0 MiB (kv_tier_mb)" in listed


def test_the_tier_stays_within_its_budget_least_recently_used_out(tmp_path):
    with tier(tmp_path, budget=10 * (1000 + kv.HEADER.size)) as t:
        for i in range(8):
            t.put(bytes([i]) * 16, b"z" * 1000)
        t.flush()
        for i in range(8):  # an old block read again is recent again
            os.utime(t.path(bytes([i]) * 16), (i, i))
        assert t.get(bytes([0]) * 16, 1000) is not None
        for i in range(8, 12):
            t.put(bytes([i]) * 16, b"z" * 1000)
        t.flush()
    kept = {p.name for _, _, p in kv.blocks(tmp_path / "v1" / "kv")}
    assert len(kept) <= 10 and t.path(bytes([0]) * 16).name in kept
    assert t.path(bytes([1]) * 16).name not in kept and t.path(bytes([11]) * 16).name in kept


def test_an_unwritable_tier_warns_once_and_still_reads(tmp_path, caplog):
    with tier(tmp_path) as t:
        t.put(b"a" * 16, b"x" * 100)
        t.flush()
    with read_only(tmp_path), tier(tmp_path) as t:
        assert t.get(b"a" * 16, 100) == b"x" * 100
        for i in range(3):
            t.put(bytes([i]) * 16, b"y" * 100)
        t.flush()
        assert not t.writable and t.get(bytes([1]) * 16, 100) is None
    assert caplog.text.count("takes no more blocks") == 1


def test_a_full_disk_keeps_the_blocks_written_and_stops_writing(tmp_path, caplog, monkeypatch):
    small = tmp_path / "small"
    small.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], capture_output=True).returncode == 0
    if not mounted:  # no tmpfs to fill: the write fails as on one
        def full(*_):
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(CacheStore, "write_file", full)
    try:
        with tier(small, budget=1 << 30) as t:
            for i in range(8):
                t.put(bytes([i]) * 16, bytes([i]) * 16000)
            t.flush()
        assert not t.writable and caplog.text.count("takes no more blocks") == 1
        written = list((small / "v1" / "kv").glob("*/*.kv"))
        assert len(written) < 8 and all(kv.unpack(p.read_bytes()) for p in written)
        assert not list((small / "v1" / "tmp").iterdir())
    finally:
        if mounted:
            subprocess.run(["umount", str(small)], check=True)


class Blocks:
    """KV tensors of fake blocks: a block's bytes are whatever was last written to it."""

    block_bytes = 4

    def __init__(self):
        self.data: dict[int, bytes] = {}

    def read_block(self, block: int) -> bytes:
        return self.data.get(block, bytes(4))

    def write_block(self, block: int, data: bytes) -> None:
        self.data[block] = data


class MemoryTier(dict):
    def get(self, address: bytes, size: int) -> bytes | None:
        return dict.get(self, address)

    def put(self, address: bytes, payload: bytes) -> None:
        self[address] = payload


def scheduler(tier: MemoryTier, runner: Blocks, num_blocks: int = 16) -> Scheduler:
    return Scheduler(num_blocks=num_blocks, block_size=4, prefill_chunk=64, max_running=4, caching=True,
                     seed=b"graph", tier=TierLink(tier, runner))


def admit(s: Scheduler, seq_id: str, prompt: list[int]) -> int:
    s.add(seq_id, prompt)
    s.plan()
    s.commit()
    return s.cached(seq_id)


def test_prompt_blocks_go_down_once_computed_and_come_back_in_another_pool():
    tier, first = MemoryTier(), Blocks()
    a = scheduler(tier, first)
    for block in range(16):
        first.write_block(block, bytes([block]) * 4)  # what each block's pass "computed"
    assert admit(a, "a", list(range(18))) == 0 and len(tier) == 4  # 4 full prompt blocks of 18 tokens
    second = Blocks()
    b = scheduler(tier, second)  # a restarted worker: an empty pool, the same tier
    assert admit(b, "b", list(range(18)) + [99]) == 16
    assert sorted(second.data.values()) == sorted(tier.values())
    # The last prompt token alone is never left to compute (scheduler.prompt_chunk): 17 tokens
    # take three blocks from the pool, and the tier is not asked past what may be reused.
    assert admit(scheduler(tier, Blocks()), "c", list(range(17))) == 12


def test_a_tier_miss_evicts_no_cached_block():
    s = scheduler(MemoryTier(), Blocks(), num_blocks=8)
    admit(s, "a", list(range(32)))  # every block of the pool, then all cached
    s.finish("a")
    s.tier.tier = MemoryTier()  # a tier that holds none of what comes next
    admit(s, "r", [200, 201, 202])  # running: one block, one cached block evicted for it
    cached, evictions = s.pool.cached, s.pool.evictions
    s.pool.drain()
    s.add("b", list(range(100, 129)))  # 8 blocks: it waits, and each plan asks the tier again
    for _ in range(3):
        s.plan()
        s.commit()
        assert s.waiting == ["b"]
    assert s.tier.loaded == 0 and s.pool.cached == cached and s.pool.evictions == evictions
    assert not [e for e in s.pool.drain() if type(e).__name__ == "Removed"]


def test_the_tier_fills_no_block_a_running_sequence_needs_to_grow():
    tier, runner = MemoryTier(), Blocks()
    admit(scheduler(tier, runner), "a", list(range(40)))  # 10 blocks in the tier
    s = scheduler(tier, Blocks(), num_blocks=12)
    for i in range(3):
        s.add(f"r{i}", [200 + i, 201, 202])
    s.plan()
    assert s.free_blocks == 9
    s.add("long", list(range(40)) + [7])
    s.plan()
    assert s.tier.loaded == 9 - 3 - 1  # a spare block left per running sequence, and one more


def run_worker(model: Path, cache_dir: Path, *flags: str) -> dict:
    out = subprocess.run([sys.executable, str(CHILD), str(model), str(cache_dir), str(PROMPT), *flags],
                         capture_output=True, text=True, timeout=300, cwd=CHILD.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def files_by_chain(cache_dir: Path, answer: dict) -> list[Path]:
    """The tier's block files of ``answer``'s prompt, the chain's first block first."""
    found = {p.stem: p for p in (cache_dir / "v1" / "kv").glob("*/*.kv")}
    return [found[address] for address in answer["chain"]]


def same_answer(a: dict, b: dict) -> None:
    assert a["tokens"] == b["tokens"] and a["logprobs"] == b["logprobs"]


@pytest.fixture(scope="module")
def fresh(tiny_model, tmp_path_factory):
    """The answer without the tier, and a cache directory whose tier holds the prompt."""
    model, cache_dir = tiny_model(), tmp_path_factory.mktemp("kv-cache")
    without = run_worker(model, cache_dir, "--no-tier")
    first = run_worker(model, cache_dir)
    assert first["saved"] == PROMPT // 32 and first["cached_prompt_tokens"] == 0
    same_answer(first, without)
    return model, cache_dir, without


def test_a_restarted_worker_loads_the_prefix_from_the_tier_with_the_same_answer(fresh):
    model, cache_dir, without = fresh
    again = run_worker(model, cache_dir)
    assert again["loaded"] == PROMPT // 32 and again["cached_prompt_tokens"] >= 0.9 * PROMPT
    same_answer(again, without)


def test_a_prefix_one_worker_computed_is_a_hit_on_another_running_beside_it(tiny_model, tmp_path):
    model = tiny_model()
    first = subprocess.Popen([sys.executable, str(CHILD), str(model), str(tmp_path), str(PROMPT), "--hold"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=CHILD.parent)
    try:
        computed = json.loads(first.stdout.readline())
        other = run_worker(model, tmp_path)
    finally:
        first.communicate("\n", timeout=60)
    assert computed["saved"] == PROMPT // 32 and other["loaded"] == PROMPT // 32
    same_answer(other, computed)


def test_damaged_block_files_are_recomputed_with_the_same_answer(fresh):
    model, cache_dir, without = fresh
    assert len(list((cache_dir / "v1" / "kv").glob("*/*.kv"))) == PROMPT // 32
    # One flipped bit in the chain's third block, the last one cut short (as a write cut off).
    files = files_by_chain(cache_dir, without)
    data = bytearray(files[2].read_bytes())
    data[-7] ^= 0x10
    files[2].write_bytes(bytes(data))
    files[-1].write_bytes(files[-1].read_bytes()[:1000])
    again = run_worker(model, cache_dir)
    same_answer(again, without)
    assert again["loaded"] == 2 and again["saved"] == PROMPT // 32 - 2
    assert all(kv.unpack(f.read_bytes()) is not None for f in (cache_dir / "v1" / "kv").glob("*/*.kv"))


def test_a_read_only_cache_dir_keeps_serving_from_its_tier(fresh):
    model, cache_dir, without = fresh
    with read_only(cache_dir):
        again = run_worker(model, cache_dir)
    same_answer(again, without)
    assert again["loaded"] == PROMPT // 32


def test_a_worker_killed_mid_write_leaves_no_block_that_loads(tiny_model, tmp_path):
    model = tiny_model()
    child = subprocess.Popen([sys.executable, str(CHILD), str(model), str(tmp_path), str(PROMPT)],
                             stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=CHILD.parent,
                             env={**os.environ, PAUSE_ENV: "kv-write"})
    try:
        for line in child.stderr:
            if line.strip() == "OVPOOL_CACHE_TEST_PAUSED kv-write":
                break
        else:
            raise AssertionError(f"the worker never reached kv-write (exit {child.wait()})")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert not list((tmp_path / "v1" / "kv").glob("*/*.kv"))  # a whole block in tmp/, never renamed
    again = run_worker(model, tmp_path)
    assert again["loaded"] == 0 and again["saved"] == PROMPT // 32
    same_answer(again, run_worker(model, tmp_path, "--no-tier"))
    assert maintenance.gc(CacheStore(tmp_path))["temp"]
