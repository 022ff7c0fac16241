"""One compiled-model cache default for every command and the library ($XDG_CACHE_HOME/ovpool,
else ~/.cache/ovpool), ``--no-cache`` / ``cache_dir=""`` to opt out, and the cache commands'
reports of what is in the cache and what they removed, run as a user runs them."""

from __future__ import annotations

import json
import shutil

from cli_run import clean_error, ovpool

from ovpool.cache.store import CacheStore
from ovpool.serve.spec import PoolSpec
from ovpool.worker.engine import Engine


def _settings(env: dict) -> dict:
    return {r["name"]: r for r in json.loads(ovpool("settings", "--json", env=env).stdout)}


def _default(xdg) -> dict:
    """The environment of a user with no cache setting (conftest turns the cache off for tests)."""
    return {"XDG_CACHE_HOME": str(xdg), "OVPOOL_CACHE_DIR": None}


def test_settings_shows_the_default_cache_xdg_first_then_home(tmp_path):
    xdg = _settings(_default(tmp_path / "xdg"))["cache_dir"]
    assert (xdg["value"], xdg["source"], xdg["default"]) == (str(tmp_path / "xdg" / "ovpool"), "default",
                                                             str(tmp_path / "xdg" / "ovpool"))
    home = _settings({**_default(tmp_path), "XDG_CACHE_HOME": None, "HOME": str(tmp_path)})["cache_dir"]
    assert home["value"] == str(tmp_path / ".cache" / "ovpool")
    off = _settings({"OVPOOL_CACHE_DIR": ""})["cache_dir"]
    assert (off["value"], off["source"]) == ("", "env")


def test_generate_and_the_cache_commands_share_the_default(tiny_model, tmp_path):
    env, model = _default(tmp_path), str(tiny_model())
    first = ovpool("generate", "hi", "--model", model, "--max-tokens", "2", env=env)
    again = ovpool("generate", "hi", "--model", model, "--max-tokens", "2", env=env)
    assert "(wrote)" in first.stderr and "(hit)" in again.stderr, first.stderr + again.stderr
    [row] = json.loads(ovpool("cache", "ls", "--json", env=env).stdout)
    assert row["models"] == [model] and row["hits"] == 1
    assert CacheStore(tmp_path / "ovpool").blob_path(row["entry"] + ".blob").is_file()
    assert [r["ok"] for r in json.loads(ovpool("cache", "verify", "--json", env=env).stdout)] == [True]
    explain = json.loads(ovpool("cache", "explain", "--model", model, "--json", env=env).stdout)
    assert explain["hit"] == row["entry"]
    assert "nothing to remove" in ovpool("cache", "gc", env=env).stdout


def test_no_cache_compiles_without_touching_the_cache(tiny_model, tmp_path):
    env = _default(tmp_path)
    bare = ovpool("generate", "hi", "--model", str(tiny_model()), "--max-tokens", "2", "--no-cache", env=env)
    assert bare.returncode == 0 and "(compiled)" in bare.stderr, bare.stderr
    assert not (tmp_path / "ovpool").exists()
    both = ovpool("generate", "hi", "--no-cache", "--cache-dir", str(tmp_path), env=env)
    clean_error(both, "--cache-dir or --no-cache")
    off = ovpool("cache", "ls", env={**env, "OVPOOL_CACHE_DIR": ""})
    clean_error(off, "cache_dir is empty", "OVPOOL_CACHE_DIR", "--cache-dir")


def test_serve_passes_its_cache_choice_to_every_worker():
    assert PoolSpec(cache_dir="/c").worker_argv("CPU", "CPU")[-4:] == ["--backend", "engine",
                                                                        "--cache-dir", "/c"]
    assert "--no-cache" in PoolSpec(cache_dir="").worker_argv("CPU", "CPU")


def test_engine_caches_by_default_and_opts_out_with_an_empty_cache_dir(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("OVPOOL_CACHE_DIR")
    with Engine(tiny_model()) as first:
        assert first.load_report["outcome"] == "wrote" and first.cache_dir == str(tmp_path / "ovpool")
    with Engine(tiny_model()) as again:
        assert again.load_report["outcome"] == "hit"
    for bare in (Engine(tiny_model(), cache_dir=""), Engine(tiny_model(), settings={"cache_dir": ""})):
        with bare:
            assert bare.load_report["outcome"] == "compiled" and bare.cache_dir is None


def _cached(tiny_model, root) -> str:
    with Engine(tiny_model(), cache_dir=root) as engine:
        return engine.load_report["entry"]


def test_ls_and_gc_name_a_corrupt_manifest_and_gc_counts_its_blob(tiny_model, tmp_path):
    entry, store = _cached(tiny_model, tmp_path), CacheStore(tmp_path)
    blob_size = store.blob_path(entry + ".blob").stat().st_size
    [family] = store.families()
    store.manifest_path(family).write_text("{not json")
    listed = ovpool("cache", "ls", "--cache-dir", str(tmp_path))
    assert listed.returncode == 0 and f"BAD manifest {family}" in listed.stderr, listed.stderr
    assert "cache gc" in listed.stderr and "nothing cached yet" not in listed.stdout
    gc = ovpool("cache", "gc", "--cache-dir", str(tmp_path))
    assert "removed 1 unreadable manifest(s)" in gc.stdout, gc.stdout
    assert f"removed 1 blob(s) no entry uses\n  {entry}.blob" in gc.stdout
    freed_mib = float(gc.stdout.split("freed ")[1].split()[0])
    assert freed_mib >= round(blob_size / (1 << 20), 1) and not store.blob_path(entry + ".blob").exists()


def test_gc_reports_an_orphaned_blob_and_the_bytes_it_frees(tiny_model, tmp_path):
    entry, store = _cached(tiny_model, tmp_path), CacheStore(tmp_path)
    blob_size = store.blob_path(entry + ".blob").stat().st_size
    [family] = store.families()
    store.manifest_path(family).unlink()  # the blob outlives its manifest
    report = json.loads(ovpool("cache", "gc", "--cache-dir", str(tmp_path), "--json").stdout)
    assert report["blobs"] == [entry + ".blob"] and report["freed_bytes"] >= blob_size


def test_a_miss_for_a_copy_of_the_model_says_so_plainly(tiny_model, tmp_path):
    _cached(tiny_model, tmp_path / "cache")
    copy = shutil.copy(tiny_model(), tmp_path / "copy.gguf")  # e.g. another venv's wheel
    out = ovpool("cache", "explain", "--model", str(copy), "--cache-dir", str(tmp_path / "cache")).stdout
    assert "MISS: the same model file at another path" in out
    assert f"{copy} here, {tiny_model()} in cache" in out
    assert "a new entry; use source_identity=content to share" in out
