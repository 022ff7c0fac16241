"""A graph whose constants live in a ConstantArena computes the same numbers, and the arena's pages
leave the process once released without changing them."""

from __future__ import annotations

import errno
import mmap
import re
import threading
import time

import numpy as np
import openvino as ov
import pytest

from ovpool.config import WorkerConfig
from ovpool.settings import Settings
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.graph import arena as arena_module
from ovpool.worker.graph import loading
from ovpool.worker.graph.arena import ConstantArena, file_rss, filesystem, next_period
from ovpool.worker.graph.builder import build_model
from ovpool.worker.graph.compile_settings import compile_config

IDS = np.array([[5, 9, 2, 7, 1, 3, 8]], np.int64)


def logits(path, arena=None, settings=None):
    s = Settings.coerce(settings or {})
    core = ov.Core()
    compiled = core.compile_model(build_model(GGUFModel.open(path), s, arena=arena), "CPU",
                                  compile_config(s, "CPU", core))
    request = compiled.create_infer_request()
    return compiled, lambda: run_stateful(request)


def run_stateful(request: ov.InferRequest) -> np.ndarray:
    n = IDS.shape[1]
    feeds = {"input_ids": IDS, "attention_mask": np.ones((1, n), np.int64),
             "position_ids": np.arange(n, dtype=np.int64)[None], "beam_idx": np.zeros(1, np.int32),
             "logits_from": np.array([0], np.int64)}
    request.reset_state()
    return request.infer(feeds)["logits"].copy()


def resident(arena: ConstantArena) -> int:
    """Bytes of the arena's mappings resident in this process."""
    return mapped_rss([np.frombuffer(m, np.uint8).ctypes.data for m in arena._maps])


def mapped_rss(addresses) -> int:
    """Resident bytes of the mappings holding ``addresses`` (from /proc/self/smaps)."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            inside = any(lo <= a < hi for a in addresses)
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


@pytest.mark.parametrize("weight_type", ["Q4_1", "Q4_K", "Q8_0", "Q6_K", "F16"])
def test_arena_constants_compute_the_same_logits_before_and_after_their_release(tiny_model, weight_type):
    path = tiny_model("llama", weight_type, False, n_layers=2, n_embd=256, n_ff=768)
    _, plain = logits(path)
    expected = plain()
    with ConstantArena.open() as arena:
        arena.release_period_s = None  # released by hand here, so residency is exact
        compiled, run = logits(path, arena)
        assert arena.size > 0 and resident(arena) > 0  # the constants, just written
        np.testing.assert_array_equal(run(), expected)
        arena.release()
        assert resident(arena) == 0
        np.testing.assert_array_equal(run(), expected)  # bytes back from the page cache if read
        del compiled, run


def test_the_arena_releases_its_pages_by_itself(tiny_model, monkeypatch):
    monkeypatch.setattr(arena_module, "RELEASE_PERIOD_S", 0.01)
    with ConstantArena.open() as arena:
        compiled, run = logits(tiny_model("llama", "Q4_1", False, n_layers=2, n_embd=256, n_ff=768), arena)
        run()
        deadline = time.monotonic() + 30  # a liveness bound, not a timing: one release is enough
        while resident(arena) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert resident(arena) == 0
        del compiled, run


def test_releases_back_off_while_pages_come_back_slowly_and_not_in_a_burst():
    short, idle, mib = 0.02, 0.64, 1 << 20
    assert next_period(short, 0, short, idle) == 0.04  # nothing came back: wait twice as long
    assert next_period(0.32, 0, short, idle) == idle
    assert next_period(idle, 4096, short, idle) == idle  # a looked-up row now and then
    assert next_period(idle, 3 * mib, short, idle) == short  # 4.7 MiB/s: a burst, back to short
    assert next_period(short, 81 << 10, short, idle) == 0.04  # just under 4 MiB/s: no burst
    assert next_period(0.16, None, short, idle) == short  # residency unknown: release as often as ever


class Waits(threading.Event):
    """The release thread's waits, recorded, none waiting: ``signals`` says what each one returns
    (True: ``burst`` was called); after the last, the arena stops."""

    def __init__(self, arena: ConstantArena, signals: list[bool]):
        super().__init__()
        self.arena, self.signals, self.waits = arena, signals, []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        if len(self.waits) == len(self.signals):
            self.arena._stop.set()
        return self.signals[len(self.waits) - 1]


def test_the_release_thread_waits_what_each_release_dropped_calls_for(monkeypatch):
    mib = 1 << 20
    # file RSS before and after each release: a burst, then single pages, then a burst again.
    readings = iter([200 * mib, 100 * mib, 100 * mib + 4096, 100 * mib, 100 * mib, 100 * mib,
                     150 * mib, 100 * mib])
    monkeypatch.setattr(arena_module, "file_rss", lambda: next(readings))
    monkeypatch.setattr(arena_module, "RELEASE_PERIOD_S", 0.02)  # the waits below are its multiples
    with ConstantArena.open() as arena:
        arena._burst = Waits(arena, [False] * 5)
        arena._releases()
        assert arena._burst.waits == [0.02, 0.02, 0.04, 0.08, 0.02]


def test_a_burst_announced_cuts_the_long_wait_short(monkeypatch):
    # A quiet spell grew the wait; a first pass is about to read every constant: from the
    # announcement on, releases come at the short period again, not after the long wait.
    monkeypatch.setattr(arena_module, "file_rss", lambda: 100 << 20)  # nothing ever dropped
    monkeypatch.setattr(arena_module, "RELEASE_PERIOD_S", 0.02)
    with ConstantArena.open() as arena:
        arena._burst = Waits(arena, [False, False, False, True, False, False])
        arena._releases()
        assert arena._burst.waits == [0.02, 0.04, 0.08, 0.16, 0.02, 0.04]
    with ConstantArena.open() as arena:
        arena.burst()
        assert arena._burst.is_set()


def test_file_rss_reads_the_shared_pages_of_statm(tmp_path):
    statm = tmp_path / "statm"
    statm.write_text("5000 1200 300 10 0 800 0\n")
    assert file_rss(statm) == 300 * mmap.PAGESIZE
    assert file_rss(tmp_path / "missing") is None
    statm.write_text("garbage\n")
    assert file_rss(statm) is None
    assert file_rss() > 0  # this process maps its own libraries


def test_a_file_that_cannot_grow_leaves_the_constants_in_memory(tiny_model, monkeypatch):
    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    path = tiny_model("llama", "Q4_1", False, n_layers=2, n_embd=256, n_ff=768)
    _, plain = logits(path)
    monkeypatch.setattr(arena_module.os, "posix_fallocate", full)
    with ConstantArena.open() as arena:
        assert arena.tensor(ov.Type.f32, [4]) is None
        _, run = logits(path, arena)
        assert arena.size == 0
        np.testing.assert_array_equal(run(), plain())


def test_tmpfs_gets_no_arena_and_mount_points_are_matched_whole(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/vda / ext4 rw 0 0\ntmpfs /tmp tmpfs rw 0 0\ntmpfs /run/user tmpfs rw 0 0\n"
                      "/dev/vdb /tmpdata xfs rw 0 0\n")
    assert filesystem("/tmp/x/y", mounts) == "tmpfs"
    assert filesystem("/tmpdata/x", mounts) == "xfs"  # not /tmp's
    assert filesystem("/home/u", mounts) == "ext4"
    assert filesystem("/x", tmp_path / "missing") == ""
    shm = "/dev/shm"
    if filesystem(shm) == "tmpfs":
        assert ConstantArena.open(shm) is None


def test_a_cache_hit_runs_on_its_blob_whose_pages_the_arena_releases(tiny_model, tmp_path, monkeypatch):
    path = tiny_model("llama", "Q4_1", False, n_layers=2, n_embd=256, n_ff=768)
    monkeypatch.setattr(arena_module, "RELEASE_PERIOD_S", None)  # released by hand: residency is exact
    settings = WorkerConfig.of(Settings.coerce({"attention": "sdpa"}))
    core = ov.Core()
    kwargs = dict(cache_dir=tmp_path, cache_only=False)
    with loading.load_graph(GGUFModel.open(path), settings, "CPU", core, **kwargs) as first:
        assert first.outcome == "wrote"
        expected = infer(first.compiled)
    with loading.load_graph(GGUFModel.open(path), settings, "CPU", core, **kwargs) as hit:
        assert hit.outcome == "hit" and hit.arena is not None
        blob = hit.blob.pages
        np.testing.assert_array_equal(infer(hit.compiled), expected)
        assert mapped_rss([blob.ctypes.data]) > 0
        hit.arena.release()
        assert mapped_rss([blob.ctypes.data]) == 0
        np.testing.assert_array_equal(infer(hit.compiled), expected)
        del blob


def infer(compiled: ov.CompiledModel) -> np.ndarray:
    return run_stateful(compiled.create_infer_request())
