"""The engine's single-stream path on the paged graph: exact logits, growing KV blocks, and the
choice between the paged and the stateful graph (ovpool.worker.graph.loading)."""

from __future__ import annotations

import json

import numpy as np
import openvino as ov
import pytest

from ovpool import Engine
from ovpool.cache.store import CacheStore
from ovpool.testing.reference import Reference
from ovpool.testing.tiny import ARCHITECTURES
from ovpool.worker.generate import batch
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.graph import loading
from ovpool.worker.graph.loading import reimport_problem

EXACT = {"inference_precision": "f32", "kv_cache_precision": "f32"}


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("weight_type", ["F16", "Q4_1", "Q4_K"])
def test_paged_logits_match_the_numpy_reference(tiny_model, arch, weight_type):
    path = tiny_model(arch, weight_type, False)
    ids = [int(t) for t in np.random.default_rng(3).integers(0, 200, 13)]
    expected = Reference(GGUFModel.open(path)).logits(np.array(ids))
    with Engine(path, settings={**EXACT, "attention": "paged"}) as eng:
        assert eng.attention == "paged"
        np.testing.assert_allclose(eng.logits(ids), expected, atol=2e-4 * np.abs(expected).max())


def test_paged_sequences_outgrowing_their_blocks_match_the_stateful_graph(tiny_model, monkeypatch):
    monkeypatch.setattr(batch, "_SESSION_POSITIONS", 32)  # one block: every sequence here grows
    path = tiny_model("llama", "Q4_1")
    prompt = "the quick brown fox jumps over the lazy dog " * 3
    runs = {}
    for attention in ("paged", "sdpa"):
        with Engine(path, settings={**EXACT, "attention": attention}) as eng:
            long_ids = eng.tokenize(prompt * 2)
            runs[attention] = (eng.complete(prompt, max_tokens=90, ignore_eos=True).token_ids,
                               eng.logits(long_ids))
    assert len(runs["paged"][0]) == 90 and runs["paged"][0] == runs["sdpa"][0]
    np.testing.assert_allclose(runs["paged"][1], runs["sdpa"][1], atol=1e-4)


def test_auto_runs_paged_unless_the_cache_cannot_hold_it(tiny_model, tmp_path):
    path = tiny_model("llama", "Q8_0")
    with Engine(path) as eng:
        assert eng.attention == "paged" and eng.graph_settings["attention"] == "paged"
        broken = reimport_problem(eng.core, eng.device)
    with Engine(path, cache_dir=tmp_path) as cached:
        assert cached.attention == ("sdpa" if broken else "paged")
        assert cached.load_report["outcome"] == "wrote"
    with Engine(path, settings={"stateful": False}) as stateless:
        assert stateless.attention == "sdpa"
    with Engine(path, settings={"attention": "manual"}) as manual:
        assert manual.attention == "manual"


def test_a_cache_dir_keeps_the_paged_reimport_answer_per_openvino_version(tmp_path, monkeypatch):
    core, store, key = ov.Core(), CacheStore(tmp_path), f"paged import {ov.get_version()} CPU"
    monkeypatch.setattr(loading, "_REIMPORT", {})  # a fresh process
    answer = reimport_problem(core, "CPU", tmp_path)
    assert json.loads(store.probes_path.read_text()) == {key: answer}
    # In plain words: OpenVINO's own message (its rt_info keys, its source lines) stays in the debug log.
    assert answer is None or ("k_head_size" not in answer and "cannot import" in answer)
    store.probes_path.write_text(json.dumps({key: "kept answer"}))
    monkeypatch.setattr(loading, "_REIMPORT", {})
    assert reimport_problem(core, "CPU", tmp_path) == "kept answer"  # read, not probed again
    store.probes_path.write_text("{ torn")
    monkeypatch.setattr(loading, "_REIMPORT", {})
    again = reimport_problem(core, "CPU", tmp_path)  # probed again
    assert (again is None) == (answer is None) and again != "kept answer"
    assert json.loads(store.probes_path.read_text()) == {key: again}


def test_the_batcher_shares_the_engines_paged_graph(tiny_model):
    from ovpool.worker.backend import EngineBackend

    with Engine(tiny_model("llama", "Q8_0"), settings={"decode_graph": "on"}) as eng:  # auto: not on AMX
        backend = EngineBackend(eng, slots=2)
        assert backend.wait_batching()
        assert eng.load_report["paged"]["outcome"] == "shared"
        backend.idle()  # one warm-up serves both: it is one compiled graph
        assert eng.warmed and backend.runs.warmed
        assert eng.load_result.decode.ready() is not None  # and it made their decode graph
        assert eng.complete("hello", max_tokens=3, ignore_eos=True).finish_reason == "length"


def test_a_worker_lets_its_stateful_graph_go_once_it_batches(tiny_model, tmp_path):
    """With a cache the engine starts on the stateful graph (a hit imports it); once the batcher
    serves, single streams run on the batcher's paged graph and the stateful graph and its blob's
    mapping go (a warm-cache SmolLM2 worker: 112 MiB less after its warm-up)."""
    from ovpool.sampling_params import SamplingParams
    from ovpool.worker.backend import EngineBackend, Finished

    path, settings = tiny_model("llama", "Q8_0"), {**EXACT, "attention": "sdpa"}
    with Engine(path, settings=settings, cache_dir=tmp_path):
        pass  # writes the stateful graph's cache entry
    with Engine(path, settings=settings, cache_dir=tmp_path) as eng:
        stateful = eng.load_result
        assert stateful.outcome == "hit" and stateful.blob.pages is not None
        backend = EngineBackend(eng, slots=2)
        assert backend.wait_batching()
        assert eng.attention == "paged" and eng.compiled is backend.runs.runner.compiled
        assert stateful.blob.pages is None and stateful not in eng.graphs.held
        backend.add("r", "hello there", SamplingParams(max_tokens=5, ignore_eos=True))
        batched = [ev for _ in range(8) for ev in backend.step() if isinstance(ev, Finished)]
        alone = eng.complete("hello there", max_tokens=5, ignore_eos=True)
        assert [f.completion.token_ids for f in batched] == [alone.token_ids]
