"""Output fits the terminal: every table at 80 columns (rich's own width detection, here COLUMNS)
keeps each word whole and each line within the width; ``--json`` is there for programs."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from cli_run import ovpool

from ovpool.cli.common import timings_text
from ovpool.cli.tables import fit, records
from ovpool.client import Client
from ovpool.testing.pool import broker, fast_heartbeats, free_endpoint, null_worker, wait_for_workers
from ovpool.worker.engine import Engine


def assert_fits(out: str, width: int, texts) -> None:
    """Every line within ``width``; every word of ``texts`` appears whole (nothing cut or folded)."""
    assert out.strip()
    too_long = [line for line in out.splitlines() if len(line) > width]
    assert not too_long, "\n".join(too_long)
    tokens = set(out.split())
    cut = {word for text in texts for word in str(text).split() if word not in tokens}
    assert not cut, f"words cut or missing: {sorted(cut)[:10]}\n{out}"


@pytest.mark.parametrize("columns", [80, 300])
def test_settings_fit_the_terminal(columns):
    rows = json.loads(ovpool("settings", "--json").stdout)
    out = ovpool("settings", env={"COLUMNS": str(columns)}).stdout
    assert_fits(out, columns, [v for r in rows for v in (r["name"], r["value"], r["env"], r["help"])])
    assert ("┃ name" in out) == (columns == 300)  # a table where it fits, records where not


@pytest.mark.parametrize("columns", [80, 400])
def test_cache_ls_fits_the_terminal(tiny_model, columns):
    # Short directories: pytest's own tmp_path (longer under xdist and in CI) would be the widest
    # line, and `ls` prints the model's path whole (a path is only useful unbroken).
    with tempfile.TemporaryDirectory(prefix="c-") as short:
        model = Path(short, "m.gguf")
        shutil.copyfile(tiny_model(), model)
        _check_cache_ls_fits(model, Path(short, "cache"), columns)


def _check_cache_ls_fits(model, tmp_path, columns):
    with Engine(model, cache_dir=tmp_path):
        pass
    [row] = json.loads(ovpool("cache", "ls", "--cache-dir", str(tmp_path), "--json").stdout)
    out = ovpool("cache", "ls", "--cache-dir", str(tmp_path), env={"COLUMNS": str(columns)}).stdout
    assert_fits(out, columns, [row["entry"], row["architecture"], row["form"], row["device"],
                               str(model), *(f"{k}={v}" for k, v in row["settings"].items())])
    verify = json.loads(ovpool("cache", "verify", "--cache-dir", str(tmp_path), "--json").stdout)
    assert [(r["entry"], r["ok"]) for r in verify] == [(row["entry"], True)]


def test_status_is_plain_text_that_fits_and_json_for_programs():
    endpoint = free_endpoint()
    with fast_heartbeats(0.2), broker(endpoint), null_worker(endpoint, model="tiny", slots=2), \
            Client(endpoint) as client:
        wait_for_workers(client, 1)
        client.complete("hello", max_tokens=2)
        out = ovpool("status", "--broker", endpoint, env={"COLUMNS": "80"}).stdout
        status = json.loads(ovpool("status", "--broker", endpoint, "--json").stdout)
    [worker] = status["workers"]
    assert_fits(out, 80, [worker["id"], "tiny", "0/2 busy", "completed=1"])
    assert "{" not in out and "'" not in out  # no Python dicts or reprs
    assert "queued: tiny 0" in out and status["counters"]["completed"] == 1


def test_timings_read_as_words():
    assert timings_text({"ttft_s": 0.1204, "decode_tps": 25.31, "total_s": 0.614}) == \
        "first token 120 ms, 25.3 tokens/s, total 0.61 s"
    assert timings_text({"total_s": 2.0}) == "total 2.00 s"


def test_columns_never_get_narrower_than_their_longest_word():
    rows = [("a", "short words only", "x"), ("bb", "ScaledDotProductAttention and more", "y")]
    widths = fit(("name", "help", "v"), rows, (), 60)
    assert widths is not None and widths[1] >= len("ScaledDotProductAttention") and sum(widths) + 10 <= 60
    assert fit(("name", "help", "v"), rows, (), 36) is None  # then each row is a record
    lines = records("t", ("name", "help", "v"), rows, 36)
    assert all(len(line) <= 36 for line in lines) and "  help: ScaledDotProductAttention" in lines
