"""`ovpool serve` stopped and started again takes a ~2,000-token prefix it served before the
restart from the KV tier (ovpool.cache.kv), with the same greedy tokens as when it computed it.

One pair of serve processes (SmolLM2, one worker, one cache directory) serves every assertion
here: it is the slow part (two starts, the first compiling, and one 2,000-token prefill): 86 s
on 2 shared cores at load 8 (64 s of it the first life), 146 s at load 12.6 (91 s). It replaced a
203-token test on the tiny model."""

from __future__ import annotations

import time

import pytest
from serve_helpers import serve, wait_for

from ovpool.client import Client

PREFIX = 2000  # prompt tokens at least


def long_text() -> str:
    """A prompt of some 2,020 SmolLM2 tokens: a made-up log, no two lines alike."""
    colours = ("red", "green", "blue", "amber", "violet", "grey", "white")
    return "\n".join(f"Entry {i}: the {colours[i % 7]} lamp in room {i * 37 % 101} reads {i * i % 997}."
                     for i in range(103))


def one_life(run_dir, args: tuple[str, ...], model: str) -> dict:
    """Start serve, send the prompt once (greedy), stop it; what the reply and worker said."""
    run_dir.mkdir()
    # The default heartbeat, not serve_helpers' fast one: on shared cores one 256-token prefill
    # step of SmolLM2 has outlasted its 0.6 s expiry, and the broker gave the worker up.
    with serve(run_dir, *args, env={"OVPOOL_HEARTBEAT_INTERVAL_S": "1.0"}) as served:
        served.wait_states("ready", timeout=300)
        # Requests go to the Batcher (and its KV pool and tier) once it is made.
        wait_for(lambda: "continuous batching:" in served.output(), 300, "the paged graph")
        with Client(served.endpoint) as client:
            done = client.complete(long_text(), model=model, max_tokens=8, temperature=0,
                                   ignore_eos=True, logprobs=2)
            status = wait_for(lambda: [w["prefix_cache"] for w in client.status()["workers"]
                                       if w["prefix_cache"]["prompt_tokens"]], 30, "the counters")
    return {"tokens": [(t.token_id, t.logprob) for row in done.logprobs for t in row.top],
            "usage": done.usage, "worker": status[0]}


# prompt_lookup off (as tests/kv_tier_child.py): log-probabilities are compared to the last bit.
@pytest.fixture(scope="module")
def lives(smollm2_path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kv-restart")
    args = ("--model", str(smollm2_path), "--workers", "1", "--cache-dir", str(tmp / "cache"),
            *(f"--set={s}" for s in ("prefix_cache=on", "inference_precision=f32",
                                     "kv_cache_precision=f32", "prompt_lookup=off")))
    start = time.monotonic()
    first = one_life(tmp / "first", args, str(smollm2_path))
    middle = time.monotonic()
    again = one_life(tmp / "restarted", args, str(smollm2_path))
    print(f"\nserve lives, SmolLM2, a {first['usage'].prompt_tokens}-token prompt: first (compiles) "
          f"{middle - start:.1f} s, restarted {time.monotonic() - middle:.1f} s")
    return first, again


def test_a_restarted_serve_takes_a_2000_token_prefix_from_the_tier(lives):
    first, again = lives
    prompt = first["usage"].prompt_tokens
    assert prompt >= PREFIX and again["usage"].prompt_tokens == prompt
    assert first["usage"].cached_prompt_tokens == 0
    assert again["usage"].cached_prompt_tokens >= 0.9 * prompt
    # The worker's own counters, as it reports them to the broker, say the same.
    assert again["worker"]["cached_prompt_tokens"] == again["usage"].cached_prompt_tokens


def test_the_prefix_from_the_tier_gives_the_tokens_computing_it_gave(lives):
    first, again = lives
    assert len(first["tokens"]) >= 8 and again["tokens"] == first["tokens"]
