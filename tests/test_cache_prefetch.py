"""A hit's import begun before its lookup (ovpool.cache.prefetch), against the toy graph: taken over
only when the lookup chose the same blob file, device and config; never a wrong or corrupt model."""

import gc
import json
import os

import cache_toy
import numpy as np
import pytest
from test_cache_loader import CORE, EXPECTED, flip_middle_bit, only_entry, read_only

from ovpool.cache import maintenance, prefetch
from ovpool.cache.loader import load_compiled
from ovpool.cache.store import CacheStore
from ovpool.config import GraphConfig


@pytest.fixture
def toy(tmp_path):
    """(cache, model file): the toy graph's GGUF stand-in is random bytes."""
    path = tmp_path / "toy.gguf"
    path.write_bytes(os.urandom(8192))
    return CacheStore(tmp_path / "cache"), path


def load(cache, model_file, early=None):
    """A load as an engine's: remembered under the hint key of (model file, CPU, default settings),
    handed the import ``early`` begun from the hint."""
    key = prefetch.hint_key(model_file, "CPU", GraphConfig())
    return load_compiled(CORE, identity=cache_toy.identity(model_file), device="CPU", config={},
                         build=cache_toy.build, cache_dir=cache.root, cache_only=False, hint=key,
                         early=early)


def start(cache, model_file, graph=GraphConfig()):
    return prefetch.start(model_file, "CPU", graph, cache.root, CORE)


def test_a_hit_takes_over_the_import_begun_from_the_hint(toy):
    cache, model_file = toy
    assert start(cache, model_file) is None  # an empty cache has no hint
    written = load(cache, model_file)
    assert written.outcome == "wrote"
    early = start(cache, model_file)
    assert early is not None and early.path == cache.blob_path(only_entry(cache)[1])
    hit = load(cache, model_file, early)
    assert hit.outcome == "hit" and hit.compiled is early.result()[0] and hit.blob is early
    np.testing.assert_array_equal(cache_toy.run(hit.compiled), EXPECTED)
    assert cache.hits(only_entry(cache)[1]) == 1


def test_a_hit_owns_the_mapping_its_compiled_model_runs_on(toy):
    cache, model_file = toy
    load(cache, model_file)
    with load(cache, model_file) as hit:  # no import begun early: the lookup maps the blob itself
        assert hit.outcome == "hit" and hit.blob is not None
        gc.collect()  # only the result holds the mapping: OpenVINO's compiled model keeps none
        np.testing.assert_array_equal(cache_toy.run(hit.compiled), EXPECTED)
    assert hit.blob.blob is None


def test_other_settings_or_a_touched_model_file_have_no_hint(toy):
    cache, model_file = toy
    load(cache, model_file)
    assert start(cache, model_file, {"kv_cache_precision": "u8"}) is None
    os.utime(model_file)
    assert start(cache, model_file) is None


def test_an_import_of_another_file_is_not_taken(toy):
    cache, model_file = toy
    load(cache, model_file)
    early = start(cache, model_file)
    early.result()
    copy = early.path.with_suffix(".copy")  # the same bytes in another file, as a re-export writes
    copy.write_bytes(early.path.read_bytes())
    copy.rename(early.path)
    hit = load(cache, model_file, early)
    assert hit.outcome == "hit" and hit.compiled is not early.result()[0] and hit.blob is not early
    np.testing.assert_array_equal(cache_toy.run(hit.compiled), EXPECTED)


def test_a_corrupt_blob_imported_early_is_still_a_miss_and_removed(toy):
    cache, model_file = toy
    load(cache, model_file)
    bad = only_entry(cache)[1]
    flip_middle_bit(cache, bad)
    early = start(cache, model_file)
    assert early is not None
    again = load(cache, model_file, early)
    assert again.outcome == "wrote" and only_entry(cache)[1].created > bad.created
    np.testing.assert_array_equal(cache_toy.run(again.compiled), EXPECTED)


def test_a_read_only_cache_hits_with_its_old_hint(toy):
    cache, model_file = toy
    load(cache, model_file)
    [hint] = cache.hints_dir.iterdir()
    hint.write_text('{"blob": "gone.blob", "device": "CPU", "config": {}}')
    with read_only(cache.root):
        assert start(cache, model_file) is None  # the hint names no blob: nothing begun
        assert load(cache, model_file).outcome == "hit"
    assert "gone.blob" in hint.read_text()
    load(cache, model_file)  # writable again: the hint follows the hit
    assert start(cache, model_file).path == cache.blob_path(only_entry(cache)[1])


def test_gc_removes_hints_whose_blob_is_gone(toy):
    cache, model_file = toy
    load(cache, model_file)
    (hint,) = cache.hints_dir.iterdir()
    torn = cache.hints_dir / "torn.json"
    torn.write_text("{ not json")
    assert maintenance.gc(cache)["hints"] == ["torn.json"]  # the live hint stays
    assert hint.exists() and not torn.exists()
    _, entry = only_entry(cache)
    cache.remove(cache.blob_path(entry))
    assert maintenance.gc(cache)["hints"] == [hint.name]
    assert list(cache.hints_dir.iterdir()) == []


def counting_pass():
    """A first pass that records the compiled models it ran on."""
    ran = []
    return ran, ran.append


def test_the_first_pass_runs_once_the_blob_matches_its_hints_checksum(toy):
    cache, model_file = toy
    load(cache, model_file)
    ran, first_pass = counting_pass()
    early = prefetch.start(model_file, "CPU", GraphConfig(), cache.root, CORE, first_pass=first_pass)
    assert early.set_up.result() is True
    hit = load(cache, model_file, early)
    assert hit.outcome == "hit" and ran == [hit.compiled]
    np.testing.assert_array_equal(cache_toy.run(hit.compiled), EXPECTED)


def test_a_blob_unlike_its_hint_or_a_hint_without_checksum_runs_no_first_pass(toy):
    cache, model_file = toy
    load(cache, model_file)
    [hint] = cache.hints_dir.iterdir()
    text = hint.read_text()
    flip_middle_bit(cache, only_entry(cache)[1])
    ran, first_pass = counting_pass()
    early = prefetch.start(model_file, "CPU", GraphConfig(), cache.root, CORE, first_pass=first_pass)
    assert early.set_up.result() is False and ran == []
    assert load(cache, model_file, early).outcome == "wrote"  # and the lookup still finds it bad
    hint.write_text(json.dumps({k: v for k, v in json.loads(text).items() if k != "checksum"}))
    early = prefetch.start(model_file, "CPU", GraphConfig(), cache.root, CORE, first_pass=first_pass)
    assert early.set_up.result() is False and ran == []  # a hint from before checksums
