"""``ovpool cache ls|show|verify|gc|rm|explain`` on a cache populated by the real Engine."""

import json

import pytest
from click.testing import CliRunner

from ovpool.cache.store import CacheStore
from ovpool.cli import main
from ovpool.errors import ConfigError
from ovpool.worker.engine import Engine


@pytest.fixture(scope="module")
def populated(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    with Engine(tiny_model(), cache_dir=root) as engine:
        assert engine.load_report["outcome"] == "wrote"
        return root, tiny_model(), engine.load_report["entry"]


def cli(*args, env=None, code=0):
    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result.output


def test_ls_reports_what_an_operator_needs(populated):
    root, model, entry = populated
    [row] = json.loads(cli("cache", "ls", "--cache-dir", str(root), "--json"))
    assert (row["entry"], row["models"], row["architecture"]) == (entry, [str(model)], "llama")
    assert row["device"].startswith("CPU") and "kv_cache_precision" in row["settings"]
    assert {p["name"] for p in row["ports"]} >= {"input_ids", "logits"}
    assert row["size"] == CacheStore(root).blob_path(entry + ".blob").stat().st_size
    assert row["last_hit"] is None and row["hits"] == 0 and row["stale"] is None  # never imported yet
    assert entry in cli("cache", "ls", env={"OVPOOL_CACHE_DIR": str(root)})


def test_show_accepts_a_unique_prefix(populated):
    root, _, entry = populated
    info = json.loads(cli("cache", "show", entry[:10], "--cache-dir", str(root), "--json"))
    assert info["entry"] == entry and info["fingerprint"]["architecture"] == "llama"
    assert "no entry" not in cli("cache", "show", entry[:10], "--cache-dir", str(root))


def test_explain_says_hit_or_names_the_difference(populated):
    root, model, entry = populated
    hit = json.loads(cli("cache", "explain", "--model", str(model), "--cache-dir", str(root), "--json"))
    assert hit["hit"] == entry and hit["fingerprint"]["model[0] st_ino"]
    miss = cli("cache", "explain", "--model", str(model), "--cache-dir", str(root),
               "--set", "attention=manual")
    assert "MISS" in miss and "setting attention: manual here, sdpa in cache" in miss


def test_a_missing_cache_dir_is_a_clear_error():
    result = CliRunner().invoke(main, ["cache", "ls"], env={"OVPOOL_CACHE_DIR": ""})
    assert result.exit_code != 0 and "--cache-dir" in str(result.exception)


@pytest.mark.parametrize("refusal", ["parent", "dir"])
def test_a_cache_dir_this_user_cannot_read_is_one_line_naming_it(tmp_path, monkeypatch, refusal):
    """Was a PermissionError traceback (`ovpool cache ls --cache-dir /proc/1/root` in a container).
    Root reads any mode bits, so the refusal is the file system's answer, stood in for."""
    from ovpool.cli import common

    locked = tmp_path / "locked"
    locked.mkdir()
    real_exists = common.Path.exists

    def exists(path):
        if refusal == "parent" and path == locked / "cache":
            raise PermissionError(13, "Permission denied", str(path))
        return real_exists(path)

    monkeypatch.setattr(common.Path, "exists", exists)
    monkeypatch.setattr(common.os, "access", lambda path, mode: path != locked)
    cache_dir = locked / "cache" if refusal == "parent" else locked
    result = CliRunner().invoke(main, ["cache", "ls", "--cache-dir", str(cache_dir)])
    unreadable = cache_dir if refusal == "parent" else locked
    reason = "(Permission denied)" if refusal == "parent" else "(permission denied)"
    assert isinstance(result.exception, ConfigError)  # one line from run_cli
    assert str(result.exception) == (
        f"cache directory {cache_dir} (from --cache-dir or --set): {unreadable} cannot be read"
        f" {reason}; pass --cache-dir with the cache's directory")


def test_verify_finds_a_flipped_bit_and_rm_removes_the_entry(tiny_model, tmp_path):
    with Engine(tiny_model(), cache_dir=tmp_path) as engine:
        entry = engine.load_report["entry"]
    store = CacheStore(tmp_path)
    assert json.loads(cli("cache", "verify", "--cache-dir", str(tmp_path), "--json"))[0]["ok"]
    blob = store.blob_path(entry + ".blob")
    data = bytearray(blob.read_bytes())
    data[-100] ^= 1
    blob.write_bytes(data)
    [bad] = json.loads(cli("cache", "verify", "--cache-dir", str(tmp_path), "--json", code=1))
    assert bad["entry"] == entry and "checksum" in bad["problem"]
    assert json.loads(cli("cache", "rm", entry, "--cache-dir", str(tmp_path), "--json")) == [entry]
    assert not blob.exists() and store.families() == []


def test_explain_says_whether_a_cache_only_worker_batches(tiny_model, tmp_path):
    from ovpool.worker.backend import EngineBackend
    from ovpool.worker.graph.loading import reimport_problem

    model = tiny_model()
    explain = ("cache", "explain", "--model", str(model), "--cache-dir", str(tmp_path), "--json")
    with Engine(model, cache_dir=tmp_path) as engine:  # the engine's graph only: no batching graph yet
        broken = reimport_problem(engine.core, engine.device)
        before = json.loads(cli(*explain))["batching"]
        assert EngineBackend(engine, slots=2).wait_batching()  # as a worker: the batching graph too
    after = json.loads(cli(*explain))["batching"]
    if not broken:
        assert before["cache-only"] == after["cache-only"] == before["default"]
        return
    assert before["cache-only"].startswith("off: ")
    assert "start once without cache-only" in before["cache-only"]
    assert after["cache-only"].startswith("on, ") and after["cache-only"].endswith("not cache-only")
    assert "cannot import a compiled paged-attention graph" in after["cache-only"]
    text = cli(*explain[:-1])
    assert f"continuous batching in cache-only mode: {after['cache-only']}" in text
