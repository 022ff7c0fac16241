"""The cache directory within one budget (ovpool.cache.budget), and `ovpool cache gc` removing
entries that can never match again, never one a live worker maps."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from ovpool import Engine
from ovpool.cache import budget
from ovpool.cache.store import CacheStore

# A worker that holds its engine (and the blob it maps) until its stdin closes.
HOLDER = "import sys; from ovpool import Engine; e = Engine(sys.argv[1], cache_dir=sys.argv[2]); " \
         "print('up', flush=True); sys.stdin.read()"


def models_in(store: CacheStore) -> set[str]:
    return {Path(m).name for manifest in store.readable_manifests() for m in manifest.models}


def test_twelve_starts_from_six_copies_stay_within_the_budget_newest_kept(tiny_model, tmp_path):
    copies = [shutil.copy(tiny_model(), tmp_path / f"copy{i}.gguf") for i in range(6)]
    store = CacheStore(tmp_path / "cache")
    for start in range(12):
        with Engine(copies[start % 6], cache_dir=store.root, settings={"cache_max_mb": 1}):
            pass
        assert budget.usage(store) <= 1 << 20
    kept = models_in(store)
    assert {"copy5.gguf", "copy4.gguf"} <= kept and "copy0.gguf" not in kept and "copy1.gguf" not in kept


def ovpool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ovpool", *args], capture_output=True, text=True, check=True)


def other_builder(store: CacheStore, model: Path) -> None:
    """Rewrite the manifest of ``model``'s entries as if another graph builder had written it."""
    for path in store.manifests_dir.glob("*.json"):
        data = json.loads(path.read_text())
        if data["models"] == [str(model)]:
            data["parts"]["graph builder"] = "0" * 64
            path.write_text(json.dumps(data))


def test_gc_removes_a_gone_sources_and_another_builders_entries_not_a_live_workers(tiny_model, tmp_path):
    gone, rebuilt, live = (shutil.copy(tiny_model(), tmp_path / f"{name}.gguf")
                           for name in ("gone", "rebuilt", "live"))
    store = CacheStore(tmp_path / "cache")
    for model in (gone, rebuilt, live):
        with Engine(model, cache_dir=store.root):
            pass
    # A hit: the worker's compiled model runs on the blob it maps (a worker that compiled does not).
    worker = subprocess.Popen([sys.executable, "-c", HOLDER, str(live), str(store.root)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "up"
        Path(gone).unlink()
        other_builder(store, Path(rebuilt))
        other_builder(store, Path(live))
        listed = {Path(r["models"][0]).name: r["stale"] for r in json.loads(ovpool(
            "cache", "ls", "--cache-dir", str(store.root), "--json").stdout)}
        assert "is gone" in listed["gone.gguf"] and "graph builder" in listed["rebuilt.gguf"]
        assert "graph builder" in listed["live.gguf"]
        report = json.loads(ovpool("cache", "gc", "--cache-dir", str(store.root), "--json").stdout)
        assert len(report["stale"]) == 2 and models_in(store) == {"live.gguf"}
    finally:
        worker.communicate("", timeout=60)
    ovpool("cache", "gc", "--cache-dir", str(store.root))
    assert models_in(store) == set()
