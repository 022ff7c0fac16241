"""Prefix caching end to end: with f32 compute and KV, every greedy answer is exactly the one
without the cache: multi-turn chats, partial last blocks, shared system prompts, preemption and
eviction under pressure; the single-stream engine's reuse too."""

from __future__ import annotations

from unittest.mock import patch

import pytest
from test_generate_batcher import drain

from ovpool import Engine
from ovpool.sampling_params import SamplingParams
from ovpool.worker.generate.batch import PagedRunner
from ovpool.worker.generate.batcher import Batcher
from ovpool.worker.generate.scheduler import Scheduler

F32 = {"inference_precision": "f32", "kv_cache_precision": "f32", "prefill_chunk": 16}
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=2)
LONG = SamplingParams(max_tokens=40, ignore_eos=True, logprobs=2)


@pytest.fixture(scope="module")
def engine(tiny_model):
    with Engine(tiny_model(arch="llama", weight_type="Q4_1"), settings=F32) as eng:
        yield eng


def system(n: int, salt: int = 0) -> list[int]:
    """A prompt of ``n`` token ids (the tiny vocabulary's ordinary ones)."""
    return [10 + (7 * i + salt) % 90 for i in range(n)]


def batcher(engine, caching: str, num_blocks: int = 0, prefill_chunk: int = 16, copies=True,
            tails=True) -> Batcher:
    runner = PagedRunner(engine.compiled, num_blocks=num_blocks) if num_blocks else \
        PagedRunner(engine.compiled, kv_cache_mb=16)
    return engine.batcher(runner, max_running=4, prefill_chunk=prefill_chunk, prefix_cache=caching,
                          answer_copies=copies, answer_tails=tails)


def conversations(engine, caching: str, turns: int, num_blocks: int = 0, params=GREEDY, prefill_chunk=16,
                  copies: bool = True, tails: bool = True, questions=None, same_start: bool = False,
                  apart: bool = False):
    """Three chats sharing a 70-token system prompt, ``turns`` turns each, all chats' turns side by
    side; each turn resends the history (prompt, answer, 3 new tokens). Returns (answers, batcher).
    ``prefill_chunk`` 16 is under a block: no answer copies (test_answers_copied_...).
    ``questions(chat, turn)``: the new tokens after a turn's answer (default: 3 of the turn's own);
    ``same_start``: chats 0 and 1 begin alike (so their first answers are equal too); ``apart``:
    each chat has a system prompt of its own (no first turn begins on a cached block)."""
    b = batcher(engine, caching, num_blocks, prefill_chunk, copies, tails)
    questions = questions or (lambda chat, turn: system(3, salt=turn))
    history = {f"chat{c}": system(70, salt=c if apart else 0) + system(5 + c, salt=c) for c in range(3)}
    if same_start:
        history["chat1"] = list(history["chat0"])
    answers = {}
    for turn in range(turns):
        reqs = [(f"{chat}/{turn}", list(ids), params) for chat, ids in history.items()]
        done, _, failed = drain(b, {0: reqs[:1], 1: reqs[1:]})
        assert not failed
        for chat in history:
            completion = done[f"{chat}/{turn}"]
            answers[f"{chat}/{turn}"] = (completion.token_ids, completion.logprobs)
            history[chat] += completion.token_ids + questions(chat, turn)
    return answers, b


def same_answers(cached: dict, fresh: dict) -> None:
    """Equal tokens; log-probabilities within 1e-5: a pass's batch differs with the cache (fewer
    prompt tokens), and a MatMul over other rows rounds differently (measured: 2e-6 at most)."""
    assert cached.keys() == fresh.keys()
    for key, (tokens, logprobs) in cached.items():
        assert tokens == fresh[key][0], key
        assert [lp.chosen.logprob for lp in logprobs] == \
            pytest.approx([lp.chosen.logprob for lp in fresh[key][1]], abs=1e-5), key


def test_multi_turn_chats_answer_exactly_as_without_the_cache(engine):
    cached, on = conversations(engine, caching="on", turns=3)
    fresh, off = conversations(engine, caching="off", turns=3)
    same_answers(cached, fresh)
    assert off.cached_prompt_tokens == 0 and off.prompt_tokens == on.prompt_tokens
    # Turn 1: chats 2 and 3 share chat 1's two full blocks (64 of 70 system tokens, 32 per block);
    # later turns find their whole history but its partial last block.
    block = on.runner.block_size
    assert on.cached_prompt_tokens >= 2 * 2 * block + 2 * 3 * 2 * block
    assert on.scheduler.free_blocks == on.runner.num_blocks  # every block is back (cached or empty)


def test_answers_copied_beside_the_decodes_serve_the_next_turns_exactly(engine):
    # Answers of 40 tokens after prompts of ~75 fill a block each turn (positions 64-95, then
    # 96-127): with a block of prefill budget, a batched decode pass computes it again as a
    # prompt chunk, and the chat's next turn starts on it instead of computing it.
    cached, on = conversations(engine, caching="on", turns=3, params=LONG, prefill_chunk=32, tails=False)
    _, plain = conversations(engine, caching="on", turns=3, params=LONG, prefill_chunk=32, copies=False)
    fresh, _ = conversations(engine, caching="off", turns=3, params=LONG, prefill_chunk=32)
    same_answers(cached, fresh)
    block = on.runner.block_size
    # A block a turn, but chat 0's first answer's: its prompt began on no cached block, so nothing
    # said a next turn would resend it (AnswerCopies.continued).
    assert on.cached_prompt_tokens == plain.cached_prompt_tokens + (2 * 3 - 1) * block
    assert on.scheduler.free_blocks == on.runner.num_blocks


def test_a_fresh_prompts_answer_is_not_copied(engine):
    # Chats with system prompts of their own: no first turn begins on a cached block, so no first
    # answer is copied (the copy's cost is paid only for answers a next turn likely resends); the
    # later turns, which begin on their history, are.
    kwargs = dict(caching="on", turns=3, params=LONG, prefill_chunk=32, tails=False, apart=True)
    cached, on = conversations(engine, **kwargs)
    _, plain = conversations(engine, **{**kwargs, "copies": False})
    fresh, _ = conversations(engine, **{**kwargs, "caching": "off"})
    same_answers(cached, fresh)
    assert on.cached_prompt_tokens == plain.cached_prompt_tokens + 3 * on.runner.block_size  # turn 2's


def test_answer_tails_serve_the_next_turns_exactly(engine):
    # Near each answer's end a pass that gives no first token also computes the partial block the
    # answer ends in as a prompt chunk; the next turn continues it.
    cached, on = conversations(engine, caching="on", turns=3, params=LONG, prefill_chunk=32)
    _, copies = conversations(engine, caching="on", turns=3, params=LONG, prefill_chunk=32, tails=False)
    fresh, _ = conversations(engine, caching="off", turns=3, params=LONG, prefill_chunk=32)
    same_answers(cached, fresh)
    assert on.cached_prompt_tokens > copies.cached_prompt_tokens  # tails were continued
    assert on.scheduler.free_blocks == on.runner.num_blocks


def test_a_tail_two_prompts_continue_serves_one_and_both_answer_exactly(engine):
    # Two chats' first turns end in tails (chat 1's starts on chat 0's cached system prompt, so its
    # answer gets one); then two prompts resend chat 1's history at once with different questions:
    # one claims the tail and writes its own tokens after it, the other computes that block itself
    # (a tail shared would be overwritten under it).
    answers, cached = {}, {}
    for mode in ("on", "off"):
        b = batcher(engine, mode, prefill_chunk=32)
        chats = [system(70) + system(5 + c, salt=c) for c in range(2)]
        done, _, failed = drain(b, {c: [(f"c{c}", list(p), LONG)] for c, p in enumerate(chats)})
        history = chats[1] + done["c1"].token_ids
        asks = [(f"q{q}", history + system(4, salt=20 + q), GREEDY) for q in range(2)]
        done, _, more = drain(b, {0: asks})
        assert not failed and not more
        answers[mode] = {rid: (c.token_ids, c.logprobs) for rid, c in done.items()}
        cached[mode] = sorted(c.usage.cached_prompt_tokens for c in done.values())
    same_answers(answers["on"], answers["off"])
    block = 32
    claimed, computed = cached["on"][1], cached["on"][0]
    assert computed % block == 0 and claimed % block and claimed > computed  # one continued a tail


def test_preemption_and_eviction_under_pressure_keep_answers_exact(engine):
    # 8 blocks of 32 positions for three chats of up to ~250 tokens sharing two blocks: sequences
    # are preempted (and come back on their cached blocks) and cached blocks are evicted.
    preempted = []
    plan = Scheduler.plan

    def spy(self):
        result = plan(self)
        preempted.extend(result.preempted)
        return result

    with patch.object(Scheduler, "plan", spy):
        cached, on = conversations(engine, caching="on", turns=3, num_blocks=8, params=LONG)
    fresh, _ = conversations(engine, caching="off", turns=3, params=LONG)
    same_answers(cached, fresh)
    assert preempted and on.scheduler.pool.evictions > 0 and on.cached_prompt_tokens > 0


@pytest.mark.parametrize(("attention", "mode", "kept"), [
    ("paged", "on", "prompt"), ("paged", "all", "prompt and answer"), ("sdpa", "on", "nothing")])
def test_the_single_stream_engine_reuses_its_previous_sequence(tiny_model, attention, mode, kept):
    path = tiny_model(arch="llama", weight_type="Q4_1")
    settings = {**F32, "attention": attention}
    with Engine(path, settings={**settings, "prefix_cache": mode}) as on, \
            Engine(path, settings={**settings, "prefix_cache": "off"}) as off:
        turn1 = system(60)
        first = on.complete(turn1, **GREEDY.to_dict())
        turn2 = turn1 + first.token_ids + system(4, salt=1)
        with on.generation(turn2, GREEDY) as gen:
            gen.step()  # the pass that admits it
            # Full blocks of 32 positions are reused: exact, only those of turn 1's prompt (its
            # answer came one token a pass); else the answer's too (but for its last token, sampled,
            # not fed). The stateful graph keeps no prefix cache.
            assert gen.cached == {"prompt": 32, "prompt and answer": 64, "nothing": 0}[kept]
            for _ in gen:
                pass
            second = gen.completion()
        expected = off.complete(turn2, **GREEDY.to_dict())
        if mode == "on":
            same_answers({"turn2": (second.token_ids, second.logprobs)},
                         {"turn2": (expected.token_ids, expected.logprobs)})
        with on.generation(system(30, salt=5), GREEDY) as gen:  # another prompt: starts over
            gen.step()
            assert gen.cached == 0


def test_where_auto_turns_it_on_answers_are_bit_identical_at_the_default_precision(tiny_model):
    """``prefix_cache=auto`` claims exactness where it is on, at the host's default precision (bf16
    on AVX-512 VNNI/BF16, f32 on AVX2): the same tokens; at bf16, whose int8 MatMul rows do not
    depend on the pass (cpu_class), log-probabilities equal to the last bit too (at f32 a decode
    step's row differs alone and batched: see same_answers)."""
    with Engine(tiny_model(arch="llama", weight_type="Q4_1"), settings={"prefill_chunk": 16}) as eng:
        if eng.prefix_cache != "on":
            assert eng.settings.prefix_cache == "auto" and eng.prefix_cache == "off"
            return
        # A block of prefill budget and 40-token answers: answer copies and tails at this precision too.
        cached, on = conversations(eng, caching="on", turns=3, params=LONG, prefill_chunk=32)
        _, copies = conversations(eng, caching="on", turns=3, params=LONG, prefill_chunk=32, tails=False)
        fresh, _ = conversations(eng, caching="off", turns=3, params=LONG, prefill_chunk=32)
        same_answers(cached, fresh)
        assert on.cached_prompt_tokens > copies.cached_prompt_tokens > 0
        if eng.graph_settings["inference_precision"] == "bf16":
            assert cached == fresh


def test_smollm2_chats_with_a_shared_system_prompt_answer_as_without_the_cache(smollm2_path):
    system_prompt = "You are a patient assistant who answers in one short sentence. " * 12
    with Engine(smollm2_path, settings={**F32, "prefill_chunk": 64}) as eng:
        answers = {}
        for mode in ("on", "off"):
            b = eng.batcher(PagedRunner(eng.compiled, kv_cache_mb=32, decode=eng.load_result.decode),
                            max_running=3, prefill_chunk=64, prefix_cache=mode)
            chats = {w: [{"role": "system", "content": system_prompt},
                         {"role": "user", "content": f"What is a {w}?"}] for w in ("cat", "owl", "bee")}
            for turn in range(2):
                reqs = [(f"{w}/{turn}", list(m), SamplingParams(max_tokens=20)) for w, m in chats.items()]
                done, _, failed = drain(b, {0: reqs[:1], 1: reqs[1:]})
                assert not failed
                for w, messages in chats.items():
                    answers[mode, w, turn] = done[f"{w}/{turn}"].token_ids
                    messages += [{"role": "assistant", "content": done[f"{w}/{turn}"].text},
                                 {"role": "user", "content": "And where does it live?"}]
            if mode == "on":
                assert b.cached_prompt_tokens >= 3 * 128  # the system prompt's blocks, then histories
        assert all(answers["on", w, t] == answers["off", w, t] for _, w, t in answers)
