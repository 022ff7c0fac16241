"""Parsed GGUF headers kept in the cache directory (ovpool.cache.headers): a cache hit's start reads
them instead of parsing the tokenizer's strings; any change to the file, or a bad entry, parses."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from test_cache_loader import read_only

from ovpool.cache import headers
from ovpool.cache.store import CacheStore
from ovpool.worker.model import GGUFModel


def _parses(monkeypatch) -> list[str]:
    """Record every real parse of a header."""
    seen: list[str] = []
    real = headers.read_header

    def spy(path):
        seen.append(str(path))
        return real(path)

    monkeypatch.setattr(headers, "read_header", spy)
    return seen


def test_a_second_open_reads_the_kept_header(tiny_model, tmp_path, monkeypatch):
    model = tmp_path / "m.gguf"
    shutil.copy(tiny_model("qwen2", "Q4_1"), model)
    parses = _parses(monkeypatch)
    first = GGUFModel.open(model, tmp_path / "cache")
    second = GGUFModel.open(model, tmp_path / "cache")
    assert parses == [str(model)]
    assert second.tensors == first.tensors and second.hparams == first.hparams
    assert second.metadata.keys() == first.metadata.keys()
    for key, value in first.metadata.items():  # numeric arrays come back as arrays, strings as str
        kept = second.metadata[key]
        assert type(kept) is type(value) and np.array_equal(kept, value) if isinstance(value, np.ndarray) \
            else kept == value
    os.utime(model, ns=(1, 1))  # touched: another identity
    GGUFModel.open(model, tmp_path / "cache")
    assert len(parses) == 2


@pytest.mark.parametrize("damage", [b"", b"\x00garbage", None])
def test_a_bad_entry_is_parsed_again_and_replaced(tiny_model, tmp_path, monkeypatch, damage):
    model, cache = tiny_model("llama", "Q8_0"), tmp_path / "cache"
    parsed = GGUFModel.open(model, cache)
    (entry,) = CacheStore(cache).headers_dir.iterdir()
    good = entry.read_bytes()
    entry.write_bytes(good[: len(good) // 2] if damage is None else damage)  # None: torn
    parses = _parses(monkeypatch)
    assert GGUFModel.open(model, cache).tensors == parsed.tensors
    assert len(parses) == 1 and entry.read_bytes() == good


def test_a_read_only_cache_only_means_parsing(tiny_model, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    with read_only(cache):
        parses = _parses(monkeypatch)
        GGUFModel.open(tiny_model("llama", "Q8_0"), cache)
        GGUFModel.open(tiny_model("llama", "Q8_0"), cache)
        assert len(parses) == 2
