"""The chat workload of ``ovpool bench``: closed-loop conversations through a real pool (null
workers), its summary, the ratios and the report."""

from __future__ import annotations

import contextlib

import pytest

from ovpool.bench import chat, report, workload
from ovpool.client import Client
from ovpool.testing.pool import broker, fast_heartbeats, free_endpoint, null_worker, wait_for_workers


def test_each_turn_resends_the_history_and_the_run_is_summarized():
    seen = []

    def turn(messages, max_tokens):
        seen.append([dict(m) for m in messages])
        return 0.5 if len(messages) > 2 else 2.0, f"answer {len(messages)}", max_tokens

    out = chat._closed_loops(turn, run=3, conversations=2, turns=3, max_tokens=5)
    assert len(seen) == 6 and out["completion_tokens"] == 30 and out["errors"] == []
    third = max(seen, key=len)
    assert third[0] == {"role": "system", "content": workload.system_prompt(3)}
    assert [m["role"] for m in third] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert third[2]["content"] == "answer 2"  # the previous answer, as an assistant message
    assert out["ttft_median_s_by_turn"] == {"1": 2.0, "2": 0.5, "3": 0.5}
    assert out["ttft_later_turns_median_s"] == 0.5


def test_a_chats_first_question_can_carry_a_document_of_its_own():
    assert workload.question(2, 0, document=True).startswith("Read this document first.")
    assert workload.question(2, 0, document=True) != workload.question(3, 0, document=True)
    assert workload.question(2, 1, document=True) == workload.question(2, 1)


def test_ratios_and_report_of_the_chat_scenario():
    def run(ttft, tps, share=None):
        return {"ttft_later_turns_median_s": ttft, "tokens_per_s": tps, "cached_share": share, "errors": []}
    results = {"workload": {"conversations": 16, "turns": 4, "max_tokens": 32, "system_prompt_chars": 9000,
                            "repeats": 1},
               "one_worker": {"prefix_on": run(0.2, 300.0, 0.8), "prefix_off": run(1.0, 200.0, 0.0)},
               "genai_prefix": run(0.25, 250.0),
               "two_workers": {"prefix": run(0.2, 320.0, 0.76), "least_loaded": run(0.4, 300.0, 0.4)}}
    r = chat.ratios(results)
    assert r["ttft_later_turns_on_vs_off"] == pytest.approx(0.2)
    assert r["tokens_per_s_vs_genai_prefix"] == pytest.approx(1.2)
    assert r["two_workers_cached_share_prefix_vs_one"] == pytest.approx(0.95)
    assert r["two_workers_cached_share_least_loaded_vs_one"] == pytest.approx(0.5)
    text = "\n".join(report.chat_lines({"chat": {**results, "ratios": r}}))
    assert "one worker, prefix cache on" in text and "80% of prompt tokens cached" in text


@pytest.mark.slow
def test_the_workload_runs_through_a_pool_and_reads_the_workers_counters():
    endpoint = free_endpoint()
    with fast_heartbeats(0.2), broker(endpoint), null_worker(endpoint, slots=2), \
            null_worker(endpoint, slots=2), Client(endpoint) as client:
        wait_for_workers(client, 2)
        out = chat.run_pool(client, run=1, conversations=3, turns=2, max_tokens=4)
    assert out["errors"] == [] and out["completion_tokens"] == 3 * 2 * 4
    assert set(out["ttft_median_s_by_turn"]) == {"1", "2"}
    assert out["prompt_tokens"] == sum(out["prompt_tokens_by_worker"]) > 0
    assert 0 <= out["cached_prompt_tokens"] <= out["prompt_tokens"]
    # Each second turn went where its first was answered.
    assert out["router"]["prefix_hits"] >= 3


class _FakePipe:
    """GenAI's pipeline as ChatPipeline drives it: one token per request a step; conversation
    ``rid // 1000`` answers in ``lengths[conversation]`` tokens. ``clock`` advances 1.0 a step."""

    def __init__(self, lengths, log, clock):
        self.lengths, self.log, self.clock, self.live = lengths, log, clock, []

    def add_request(self, rid, prompt, config):
        self.log.append(f"add {rid}")
        handle = _FakeHandle(self.lengths[rid // 1000])
        self.live.append(handle)
        return handle

    def step(self):
        self.log.append("step")
        self.clock[0] += 1.0
        for h in self.live:
            h.step()
        self.live = [h for h in self.live if h.left]


class _FakeHandle:
    def __init__(self, length):
        self.left, self.unread = length, []

    def step(self):
        self.left -= 1
        self.unread.append(7)

    def can_read(self):
        return bool(self.unread)

    def read(self):
        out, self.unread = self.unread, []
        return [type("Output", (), {"generated_ids": out})]

    def get_status(self):
        return "RUNNING" if self.left else "FINISHED"


def test_genai_gets_a_next_turn_after_the_step_that_follows_its_answer(monkeypatch):
    """As a served worker does: the turn a client sends at once arrives while the next step runs,
    and waits for it; the time to first token runs from the answer's end (docs/performance.md)."""
    from types import SimpleNamespace

    from ovpool.bench import peers

    log, clock = [], [0.0]
    monkeypatch.setattr(peers, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(peers, "_running", lambda: "RUNNING")
    pipe = object.__new__(peers.ChatPipeline)
    pipe.pipe = _FakePipe({0: 1, 1: 4}, log, clock)
    pipe.tokenizer = SimpleNamespace(apply_chat_template=lambda messages, add_generation_prompt: "p",
                                     decode=lambda ids: "answer")
    out = pipe.run(1, conversations=2, turns=2, max_tokens=4)
    # Chat 0's first answer ends in step 1: its second turn joins after step 2, not before it
    # (first token 2.0 after that answer). Chat 1's ends in step 4 with nothing else running: no
    # step to wait for, it joins at once (1.0).
    assert log == ["add 0", "add 1000", "step", "step", "add 1", "step", "step", "add 1001", *["step"] * 4]
    assert out["ttft_median_s_by_turn"]["2"] == 1.5
    assert out["completion_tokens"] == 10


def test_every_pool_of_the_chat_scenario_runs_without_the_disk_kv_tier(monkeypatch):
    """Runs are numbered from 1 in every invocation: a KV tier kept on disk would give a run the
    blocks (answers included) that an earlier invocation's run of that number computed."""
    started = []

    @contextlib.contextmanager
    def pool(model, slots, *, sets=(), workers=1, env=None):
        started.append(sets)
        yield None

    monkeypatch.setattr(chat.sweep, "pool", pool)
    monkeypatch.setattr(chat, "run_pool", lambda *a, **k: {"tokens_per_s": 1.0, "cached_share": 1.0,
                                                           "ttft_later_turns_median_s": 1.0})
    chat.scenario("m", "p", conversations=2, turns=2, max_tokens=2, repeats=1, sets=(), genai=False,
                  device="CPU", say=lambda line: None)
    assert len(started) == 6 and all("kv_tier=off" in sets for sets in started)
