"""Continuous batching end to end on tiny models: batched greedy output equals each request alone."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import threading

import numpy as np
import pytest

from ovpool import Engine
from ovpool.sampling_params import SamplingParams
from ovpool.worker.backend import EngineBackend, Failed, Finished, Interleaved, Token
from ovpool.worker.generate.batch import PagedRunner, zero_pages
from ovpool.worker.generate.batcher import Batcher

F32 = {"inference_precision": "f32", "kv_cache_precision": "f32", "prefill_chunk": 8}
PROMPTS = ["the quick brown fox", "a b c d e f g h i j k l m n o p q r s t u v w x y z " * 2, "hello",
           "jumps over the lazy dog and runs far away from the brown fox"]


@pytest.fixture(scope="module")
def engine(tiny_model):
    with Engine(tiny_model(arch="llama", weight_type="Q4_1"), settings=F32) as eng:
        yield eng


def drain(backend, joins=None):
    """Step until idle; ``joins`` {step: [(id, prompt, params)]} are added before that step.
    Returns ({id: Completion}, {id: [Delta]}, [Failed])."""
    joins, done, deltas, failed, step = dict(joins or {}), {}, {}, [], 0
    while backend.active or joins:
        for rid, prompt, params in joins.pop(step, []):
            backend.add(rid, prompt, params)
        for ev in backend.step():
            if isinstance(ev, Token):
                deltas.setdefault(ev.request_id, []).append(ev.delta)
            elif isinstance(ev, Finished):
                assert ev.request_id not in done, "finished twice"
                done[ev.request_id] = ev.completion
            else:
                failed.append(ev)
        step += 1
    return done, deltas, failed


def alone(engine, prompt, params):
    return engine.complete(prompt, **params.to_dict())


def test_greedy_batched_equals_alone_with_joins_and_chunked_prefill(engine):
    backend = EngineBackend(engine, slots=4)
    assert backend.wait_batching() and isinstance(backend.runs, Batcher)
    lengths = [20, 7, 33, 12]  # different lengths: sequences leave the batch at different steps
    reqs = [(str(i), p, SamplingParams(max_tokens=n, ignore_eos=True))
            for i, (p, n) in enumerate(zip(PROMPTS, lengths, strict=True))]
    done, deltas, failed = drain(backend, {0: reqs[:2], 3: reqs[2:3], 5: reqs[3:]})
    assert not failed and backend.runs.scheduler.free_blocks == backend.runs.runner.num_blocks
    for rid, prompt, params in reqs:
        expected = alone(engine, prompt, params)
        assert done[rid].token_ids == expected.token_ids
        assert done[rid].text == expected.text == "".join(d.text for d in deltas[rid])
        assert [d.index for d in deltas[rid]] == sorted({d.index for d in deltas[rid]})


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "phi3"])
def test_every_architecture_batched_equals_alone(tiny_model, arch):
    # gemma3's tiny sliding window (5 positions) is shorter than every prompt here but "hello":
    # the paged op's window, in chunked prefill and in decode, against the stateful graph's mask.
    with Engine(tiny_model(arch=arch, weight_type="Q4_K"), settings=F32) as eng:
        backend = EngineBackend(eng, slots=4)
        assert backend.wait_batching()
        reqs = [(str(i), p, SamplingParams(max_tokens=9 + 4 * i, ignore_eos=True))
                for i, p in enumerate(PROMPTS)]
        done, _, failed = drain(backend, {0: reqs[:3], 2: reqs[3:]})
        assert not failed
        for rid, prompt, params in reqs:
            assert done[rid].token_ids == alone(eng, prompt, params).token_ids


def test_preemption_under_a_small_kv_cache_keeps_outputs_identical(engine):
    runner = PagedRunner(engine.compiled, num_blocks=4)  # 128 positions for 3 requests
    batcher = engine.batcher(runner, max_running=3, prefill_chunk=8)
    reqs = [(str(i), PROMPTS[i], SamplingParams(max_tokens=40, ignore_eos=True)) for i in range(3)]
    preempted = []
    plan = batcher.scheduler.plan

    def spy():
        result = plan()
        preempted.extend(result.preempted)
        return result

    batcher.scheduler.plan = spy
    done, _, failed = drain(batcher, {0: reqs})
    assert preempted and not failed
    for rid, prompt, params in reqs:
        assert done[rid].token_ids == alone(engine, prompt, params).token_ids


def test_stop_strings_eos_and_sampling_behave_as_alone(engine):
    backend = EngineBackend(engine, slots=3)
    assert backend.wait_batching()
    greedy = alone(engine, PROMPTS[0], SamplingParams(max_tokens=12, ignore_eos=True))
    stop = greedy.text[len(greedy.text) // 2:][:3]
    reqs = [("stop", PROMPTS[0], SamplingParams(max_tokens=12, ignore_eos=True, stop=(stop,))),
            ("sampled", PROMPTS[1], SamplingParams(max_tokens=16, temperature=1.2, seed=5)),
            ("eos", PROMPTS[2], SamplingParams(max_tokens=30))]
    done, _, failed = drain(backend, {0: reqs})
    assert not failed
    for rid, prompt, params in reqs:
        expected = alone(engine, prompt, params)
        assert (done[rid].token_ids, done[rid].text, done[rid].finish_reason) == \
            (expected.token_ids, expected.text, expected.finish_reason)
    assert stop not in done["stop"].text and done["stop"].finish_reason == "stop"


def log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def test_penalties_filters_and_logprobs_batched_equal_alone_and_the_teacher_forced_logits(engine):
    backend = EngineBackend(engine, slots=4)
    assert backend.wait_batching()
    reqs = [("rep", PROMPTS[0], SamplingParams(max_tokens=14, repetition_penalty=1.3, logprobs=3)),
            ("top_p", PROMPTS[1], SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=4,
                                                 presence_penalty=0.7, frequency_penalty=0.3, logprobs=0)),
            ("min_p", PROMPTS[2], SamplingParams(max_tokens=10, temperature=1.0, min_p=0.05, top_k=30,
                                                 seed=8, logit_bias={5: 5.0}, logprobs=5)),
            ("plain", PROMPTS[3], SamplingParams(max_tokens=8, temperature=0.7, seed=2))]
    done, deltas, failed = drain(backend, {0: reqs[:2], 2: reqs[2:]})
    assert not failed
    for rid, prompt, params in reqs:
        expected = alone(engine, prompt, params)
        got = done[rid]
        assert got.token_ids == expected.token_ids
        if params.logprobs is None:
            assert got.logprobs is None and all(not d.logprobs for d in deltas[rid])
            continue
        assert [t for d in deltas[rid] for t in d.logprobs] == got.logprobs  # each token's, once
        ids = engine.prompt_ids(prompt)
        # Teacher-forced logits at f32 differ from the step-by-step passes' by ~1e-5 (paged vs
        # stateful graphs, docs/architecture.md): the log-probabilities by as little.
        want = log_softmax(engine.logits(ids + got.token_ids[:-1])[len(ids) - 1:])
        assert [t.chosen.token_id for t in got.logprobs] == got.token_ids
        for row, t, e in zip(want, got.logprobs, expected.logprobs, strict=True):
            assert abs(t.chosen.logprob - row[t.chosen.token_id]) < 1e-4
            assert abs(t.chosen.logprob - e.chosen.logprob) < 1e-4
            assert len(t.top) == params.logprobs
            top_ids = [a.token_id for a in t.top]
            np.testing.assert_allclose([a.logprob for a in t.top], row[top_ids], atol=1e-4)
            if t.top:
                assert t.top[-1].logprob >= np.sort(row)[-params.logprobs] - 1e-4


def test_cancel_frees_blocks_and_bad_requests_fail_clearly(engine):
    backend = EngineBackend(engine, slots=2)
    assert backend.wait_batching()
    backend.add("a", PROMPTS[1], SamplingParams(max_tokens=50, ignore_eos=True))
    backend.step()
    assert backend.runs.scheduler.free_blocks < backend.runs.runner.num_blocks
    backend.cancel("a")
    assert backend.active == 0 and backend.runs.scheduler.free_blocks == backend.runs.runner.num_blocks
    assert backend.step() == []
    with pytest.raises(Exception, match="max_tokens"):
        backend.add("b", "hi", SamplingParams(max_tokens=10**6))
    with pytest.raises(Exception, match="context"):
        backend.add("c", "word " * 300, SamplingParams(max_tokens=4))
    backend.add("d", "hi", SamplingParams(max_tokens=2))
    backend.add("e", "hi", SamplingParams(max_tokens=2))
    with pytest.raises(Exception, match="free slot"):
        backend.add("f", "hi", SamplingParams(max_tokens=2))


def test_a_sequence_outgrowing_the_cache_fails_with_a_clear_error(engine):
    runner = PagedRunner(engine.compiled, num_blocks=1)  # 32 positions
    batcher = engine.batcher(runner, max_running=2, prefill_chunk=8)
    with pytest.raises(Exception, match="kv_cache_mb"):
        batcher.add("too-long", "word " * 20, SamplingParams(max_tokens=4))
    done, _, failed = drain(batcher, {0: [("grows", PROMPTS[0], SamplingParams(max_tokens=60,
                                                                                 ignore_eos=True))]})
    assert not done and [f.request_id for f in failed] == ["grows"]
    assert "kv_cache_mb" in str(failed[0].error) and isinstance(failed[0], Failed)


@pytest.mark.slow
def test_smollm2_eight_batched_requests_equal_each_alone(smollm2_path):
    with Engine(smollm2_path, settings={**F32, "prefill_chunk": 16}) as eng:
        backend = EngineBackend(eng, slots=8)
        assert backend.wait_batching()
        prompts = [f"Write one sentence about a {w}." for w in "cat dog fox owl bee ant cow pig".split()]
        reqs = [(str(i), [{"role": "user", "content": p}], SamplingParams(max_tokens=24 + 4 * i))
                for i, p in enumerate(prompts)]
        done, _, failed = drain(backend, {0: reqs[:5], 2: reqs[5:]})
        assert not failed
        for rid, messages, params in reqs:
            assert done[rid].token_ids == eng.chat(messages, **params.to_dict()).token_ids


def batched_passes(backend) -> list[int]:
    """Records the number of sequences in each forward pass of ``backend``'s Batcher."""
    runner, sizes = backend.runs.runner, []
    forward = runner.forward

    def counted(chunks, *args, **kwargs):
        sizes.append(len(chunks))
        return forward(chunks, *args, **kwargs)

    runner.forward = counted
    return sizes


def test_cache_only_worker_batches_from_the_cached_ir(tiny_model, tmp_path):
    from ovpool.worker.graph.loading import reimport_problem

    model = tiny_model(arch="llama", weight_type="Q8_0")
    with Engine(model, settings=F32, cache_dir=tmp_path) as eng:  # populates every entry
        assert EngineBackend(eng, slots=3).wait_batching()
        broken = reimport_problem(eng.core, eng.device)
        assert eng.load_report["paged"]["outcome"] == ("ir-wrote" if broken else "wrote")
    with Engine(model, settings=F32, cache_dir=tmp_path, cache_only=True) as eng:
        backend = EngineBackend(eng, slots=3)
        assert backend.wait_batching() and isinstance(backend.runs, Batcher)
        assert eng.load_report["paged"]["outcome"] == ("ir-hit" if broken else "hit")
        assert eng.load_report["batching"].startswith("on")
        assert ("not cache-only" in eng.load_report["batching"]) is bool(broken)
        sizes = batched_passes(backend)
        params = SamplingParams(max_tokens=6, ignore_eos=True)
        reqs = [(str(i), PROMPTS[i], params) for i in (0, 2, 3)]
        done, _, failed = drain(backend, {0: reqs})
        assert not failed and max(sizes) == 3  # the three ran in one forward pass
        for rid, prompt, _ in reqs:
            assert done[rid].token_ids == alone(eng, prompt, params).token_ids


def test_cache_only_worker_without_the_batching_graph_says_so_and_serves(tiny_model, tmp_path):
    from ovpool.cache.maintenance import entries, remove
    from ovpool.cache.store import CacheStore
    from ovpool.worker.backend import Interleaved
    from ovpool.worker.graph.loading import reimport_problem

    model = tiny_model(arch="llama", weight_type="Q8_0")
    with Engine(model, settings=F32, cache_dir=tmp_path) as eng:
        assert EngineBackend(eng, slots=2).wait_batching()
        if not reimport_problem(eng.core, eng.device):
            pytest.skip("this OpenVINO imports compiled paged graphs: no IR entry to lack")
    store = CacheStore(tmp_path)
    [ir] = [e.id for m, e in entries(store) if "cached form" in m.parts]
    remove(store, ir)
    with Engine(model, settings=F32, cache_dir=tmp_path, cache_only=True) as eng:
        backend = EngineBackend(eng, slots=2)
        plan = eng.load_report["batching"]
        assert plan.startswith("off: ") and "start once without cache-only" in plan
        assert not backend.wait_batching() and isinstance(backend.runs, Interleaved)
        assert "no IR of the batching (paged) graph" in eng.load_report["batching"]
        params = SamplingParams(max_tokens=6, ignore_eos=True)
        done, _, failed = drain(backend, {0: [("a", PROMPTS[0], params), ("b", PROMPTS[2], params)]})
        assert not failed
        assert done["a"].token_ids == alone(eng, PROMPTS[0], params).token_ids


@contextlib.contextmanager
def stateful_engine(tiny_model, monkeypatch, before_paged_graph):
    """An engine on the stateful graph (as a cache start on OpenVINO 2026.4's CPU plugin), whose
    paged graph loads only after ``before_paged_graph()`` returns."""
    stateful = {**F32, "attention": "sdpa"}
    with Engine(tiny_model(arch="llama", weight_type="Q4_1"), settings=stateful) as engine:
        load = engine.paged_graph
        monkeypatch.setattr(engine, "paged_graph", lambda: (before_paged_graph(), load())[1])
        yield engine


def test_requests_started_before_the_paged_graph_is_ready_finish_unbatched(tiny_model, monkeypatch):
    # Its worker loads the paged graph on a thread, and serves meanwhile on the compatibility seam.
    ready = threading.Event()
    with stateful_engine(tiny_model, monkeypatch, ready.wait) as engine:
        backend = EngineBackend(engine, slots=3)
        params = SamplingParams(max_tokens=10, ignore_eos=True)
        backend.add("early", PROMPTS[0], params)  # the worker serves before the paged graph exists
        assert isinstance(backend.runs, Interleaved)
        events = backend.step()
        assert backend.idle() is True  # more idle work once the paged graph is there
        ready.set()
        assert backend.wait_batching(timeout=60)
        assert backend.idle() is False
        done, _, failed = drain(backend, {0: [("late", PROMPTS[3], params)]})
        assert not failed and backend.active == 0
        assert done["early"].token_ids == alone(engine, PROMPTS[0], params).token_ids
        assert done["late"].token_ids == alone(engine, PROMPTS[3], params).token_ids
        assert not any(isinstance(e, Finished) for e in events)


@pytest.mark.parametrize("first", ["step", "idle"])
def test_the_paged_graph_loads_after_the_first_step_or_when_idle(tiny_model, monkeypatch, first):
    # Its compile would take the cores from the first requests of a model loaded on demand.
    begun = threading.Event()
    with stateful_engine(tiny_model, monkeypatch, begun.set) as engine:
        backend = EngineBackend(engine, slots=2)
        params = SamplingParams(max_tokens=4, ignore_eos=True)
        if first == "step":
            backend.add("first", PROMPTS[2], params)  # one prefill chunk: a token at the first step
        assert not begun.wait(0.2)  # not begun beside the request's start (nor before it)
        events = backend.step() if first == "step" else backend.idle()
        assert begun.wait(60)
        assert backend.wait_batching(timeout=60)
        if first == "step":
            assert [e.request_id for e in events] == ["first"]  # its first token came first


def test_idle_warm_up_covers_the_engine_and_a_separate_batching_graph(tiny_model, tmp_path):
    model = tiny_model(arch="llama", weight_type="Q4_1")
    with Engine(model, settings=F32, cache_dir=tmp_path) as eng:
        backend = EngineBackend(eng, slots=2)
        assert backend.wait_batching()
        backend.idle()
        assert eng.warmed and backend.runs.warmed
        params = SamplingParams(max_tokens=6, ignore_eos=True)
        done, _, failed = drain(backend, {0: [("a", PROMPTS[0], params), ("b", PROMPTS[3], params)]})
        assert not failed
        assert done["a"].token_ids == alone(eng, PROMPTS[0], params).token_ids
        assert done["b"].token_ids == alone(eng, PROMPTS[3], params).token_ids


class _Broken:
    """An InferRequest whose device fails: its inputs are set as a real one's, its passes fail."""

    def __init__(self, working):
        self.model_inputs = working.model_inputs

    def set_input_tensor(self, index, tensor):
        pass

    def infer(self, *args, **kwargs):
        raise RuntimeError("device lost")


def test_a_failed_pass_fails_its_requests_with_an_inference_error_and_the_rest_go_on(engine):
    from ovpool.errors import InferenceError

    backend = EngineBackend(engine, slots=2)  # its own runner (KV blocks, requests) on the graph
    assert backend.wait_batching()
    runner = backend.runs.runner
    working = runner.requests[0]
    runner.requests[0] = _Broken(working)
    backend.add("a", PROMPTS[0], SamplingParams(max_tokens=4, ignore_eos=True))
    (failed,) = backend.step()
    assert isinstance(failed, Failed) and isinstance(failed.error, InferenceError)
    assert failed.error.code == "inference" and "device lost" in str(failed.error)
    runner.requests[0] = working
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    done, _, failures = drain(backend, {0: [("b", PROMPTS[2], params)]})
    assert not failures and len(done["b"].token_ids) == 3


def test_an_unbatched_generation_that_fails_is_an_inference_error():
    from types import SimpleNamespace

    from ovpool.errors import InferenceError
    from ovpool.worker.backend import Interleaved

    class Failing:
        prompt_ids, cached = [1], 0

        def step(self):
            raise RuntimeError("device lost")

        def close(self):
            pass

    engine = SimpleNamespace(config=SimpleNamespace(prefill_chunk=8),
                             generation=lambda prompt, params, prefill_chunk: Failing())
    interleaved = Interleaved(engine)
    interleaved.add("a", "hi", SamplingParams())
    (failed,) = interleaved.step()
    assert isinstance(failed.error, InferenceError) and "device lost" in str(failed.error)
    assert interleaved.active == 0


def test_kv_blocks_take_memory_only_where_they_are_written():
    """A worker's kv_cache_mb is a bound, not a cost: writing one block of a 64 MiB pool makes
    that page resident, not the 2 MiB huge page NumPy's np.zeros advised (SmolLM2 worker: 118 MiB
    of a 256 MiB pool resident after four short requests)."""
    memory = zero_pages(64 << 20)
    assert resident_pages(memory) == 0
    memory[0] = memory[40 << 20] = 1
    assert resident_pages(memory) == 2


def resident_pages(array: np.ndarray) -> int:
    """Pages of ``array``'s memory resident in this process (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    start = array.ctypes.data // mmap.PAGESIZE * mmap.PAGESIZE
    pages = -(-(array.ctypes.data + array.nbytes - start) // mmap.PAGESIZE)
    vector = (ctypes.c_ubyte * pages)()
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(pages * mmap.PAGESIZE), vector) == 0
    return int((np.frombuffer(vector, np.uint8) & 1).sum())


def test_a_long_prompt_is_admitted_off_the_step_and_its_refusal_fails_it_alone(engine):
    """A prompt over INLINE_CHARS is tokenized on the admission thread: ``add`` returns at once
    and a refusal comes as that request's Failed event, while a short request runs to its end."""
    from ovpool.worker.generate.batcher import INLINE_CHARS

    backend = EngineBackend(engine, slots=2)
    assert backend.wait_batching()
    long = "word " * (INLINE_CHARS // 5 + 1)  # over the model's context of 256 tokens
    done, _, failed = drain(backend, {0: [("long", long, SamplingParams(max_tokens=4)),
                                          ("short", "hi", SamplingParams(max_tokens=6, ignore_eos=True))]})
    assert [f.request_id for f in failed] == ["long"] and "context" in str(failed[0].error)
    assert done["short"].usage.completion_tokens == 6 and backend.active == 0


def test_a_request_whose_logits_row_is_nan_fails_alone_and_the_batch_goes_on(engine):
    from ovpool.errors import InferenceError

    backend = EngineBackend(engine, slots=2)
    assert backend.wait_batching()
    batcher, forward = backend.runs, backend.runs.runner.forward
    poisoned = []

    def nan_for_a(chunks, **kw):  # the device computes NaN for request a's row, once
        logits, sampled = forward(chunks, **kw).copy(), [c for c in chunks if c.sample]
        if len(sampled) == 2 and not poisoned:  # a pass where both requests get a token
            first = sampled[0].seq_id == "a"
            logits[0 if first else 1 + sampled[0].draft] = np.nan
            poisoned.append(True)
        return logits

    batcher.runner.forward = nan_for_a
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    done, _, failed = drain(backend, {0: [("a", PROMPTS[0], params), ("b", PROMPTS[2], params)]})
    assert poisoned and [f.request_id for f in failed] == ["a"]
    assert isinstance(failed[0].error, InferenceError) and "non-finite logits" in str(failed[0].error)
    assert done["b"].token_ids == alone(engine, PROMPTS[2], params).token_ids
    assert batcher.scheduler.free_blocks == batcher.runner.num_blocks


def test_a_bug_in_one_requests_sampling_fails_that_request_only(engine):
    from ovpool.errors import InferenceError

    backend = EngineBackend(engine, slots=2)
    assert backend.wait_batching()
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    backend.add("a", PROMPTS[0], params)
    backend.add("b", PROMPTS[2], params)

    def broken(logits):
        raise IndexError("index 0 is out of bounds")

    backend.runs._generations["a"]._sampler.choose = broken
    done, _, failed = drain(backend)
    assert [f.request_id for f in failed] == ["a"] and isinstance(failed[0].error, InferenceError)
    assert "IndexError('index 0 is out of bounds')" in str(failed[0].error)
    assert done["b"].token_ids == alone(engine, PROMPTS[2], params).token_ids
