"""The cache across real processes: racing starts on a cold cache, SIGKILL mid-export, gc."""

import json
import os
import subprocess
import sys
from pathlib import Path

import cache_toy
import openvino as ov
import pytest
from click.testing import CliRunner

from ovpool.cache import budget, maintenance
from ovpool.cache.loader import load_compiled
from ovpool.cache.store import PAUSE_ENV, CacheStore
from ovpool.cli import main
from ovpool.errors import CacheMissError

OVPOOL = [sys.executable, "-m", "ovpool"]
TOY = [sys.executable, str(Path(cache_toy.__file__))]


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "toy.gguf"
    path.write_bytes(os.urandom(8192))
    return path


def cli_json(*args: str):
    result = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


@pytest.mark.slow
def test_eight_processes_on_a_cold_cache_export_once(tiny_model, tmp_path):
    cache = CacheStore(tmp_path / "cache")
    command = [*OVPOOL, "generate", "--model", str(tiny_model()), "--cache-dir", str(cache.root),
               "--max-tokens", "8", "Once upon a time"]
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(8)]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, outputs[0][1]
    logs = "".join(err for _, err in outputs)
    assert logs.count("model cache WROTE ") == 1 and logs.count("model cache HIT ") == 7
    assert len(files(cache.blobs_dir)) == 1 and files(cache.tmp_dir) == []
    [entry] = cli_json("cache", "ls", "--cache-dir", str(cache.root))
    assert entry["hits"] == 7  # racing hits, counted without a lock, all count
    texts = {out for out, _ in outputs}
    assert len(texts) == 1 and texts.pop().strip()


def start_paused(cache_dir: Path, model_file: Path, phase: str, *flags: str) -> subprocess.Popen:
    """A toy exporter stopped at ``phase`` by the test hook (it waits there until killed)."""
    proc = subprocess.Popen([*TOY, str(cache_dir), str(model_file), *flags], stderr=subprocess.PIPE,
                            text=True, env={**os.environ, PAUSE_ENV: phase})
    for line in proc.stderr:
        if line.strip() == f"OVPOOL_CACHE_TEST_PAUSED {phase}":
            return proc
    raise AssertionError(f"the exporter never reached {phase} (exit {proc.wait()})")


# (temp files, blobs) a writer SIGKILLed at each phase leaves; an IR export also leaves the XML and
# weights OpenVINO serialized into tmp/ before they were packed into the blob.
LEFTOVERS = {"blob-write": (1, 0), "blob-renamed": (0, 1), "manifest-write": (1, 1)}
KINDS = {"compiled": ((), 0), "ir": (("--ir",), 2)}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("phase", list(LEFTOVERS))
def test_sigkill_during_export_leaves_no_hit_and_gc_cleans_up(tmp_path, model_file, phase, kind):
    cache = CacheStore(tmp_path / "cache")
    flags, serialized = KINDS[kind]
    proc = start_paused(cache.root, model_file, phase, *flags)
    proc.kill()
    proc.wait()
    temps, blobs = LEFTOVERS[phase]
    temps += serialized
    assert (len(files(cache.tmp_dir)), len(files(cache.blobs_dir))) == (temps, blobs)
    assert files(cache.manifests_dir) == []

    # The reads after the killed writer run in this process (a blob is read the same by any process);
    # the export after gc is a new process, as a restarted writer is.
    with pytest.raises(CacheMissError):
        cache_toy.result([str(cache.root), str(model_file), "--cache-only", *flags])

    report = cli_json("cache", "gc", "--cache-dir", str(cache.root))
    assert (len(report["temp"]), len(report["blobs"])) == (temps, blobs)
    assert files(cache.tmp_dir) == [] and files(cache.blobs_dir) == []

    again = subprocess.run([*TOY, str(cache.root), str(model_file), *flags], capture_output=True,
                           text=True, timeout=120, check=True)
    assert again.stdout.split()[1] == "wrote"
    outcome, _, output = cache_toy.result([str(cache.root), str(model_file), "--cache-only", *flags])
    assert outcome == "hit" and output == again.stdout.split()[3]


def test_gc_spares_a_live_writers_temp_and_an_exporting_family(tmp_path, model_file):
    cache = CacheStore(tmp_path / "cache")
    proc = start_paused(cache.root, model_file, "manifest-write")
    try:
        nothing = {"temp": [], "manifests": [], "blobs": [], "stale": [], "kv": [], "entries": [],
                   "hints": [], "freed_bytes": 0}
        assert cli_json("cache", "gc", "--cache-dir", str(cache.root)) == nothing
        assert len(files(cache.tmp_dir)) == 1 and len(files(cache.blobs_dir)) == 1
    finally:
        proc.kill()
        proc.wait()


def test_gc_evicts_least_recently_hit_beyond_max_bytes(tmp_path, model_file):
    cache = CacheStore(tmp_path / "cache")
    entries = [load_compiled(ov.Core(), identity=cache_toy.identity(model_file, {"kv_cache_precision": kv}),
                             device="CPU", config={}, build=cache_toy.build, cache_dir=cache.root,
                             cache_only=False).entry
               for kv in ("f16", "u8", "f32")]
    os.utime(cache.blob_path(entries[0] + ".blob"), (1, 1))  # the oldest hit
    # The whole directory's budget, less than it holds by the oldest blob's size. Not through the
    # CLI: the toy graph's builder is not this ovpool's, so `cache gc` would remove them as stale.
    limit = budget.usage(cache) - cache.blob_path(entries[0] + ".blob").stat().st_size
    report = maintenance.gc(cache, max_bytes=limit)
    assert report["entries"] == [entries[0]]
    assert sorted(files(cache.blobs_dir)) == sorted(e + ".blob" for e in entries[1:])
