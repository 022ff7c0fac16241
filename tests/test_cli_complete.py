"""``ovpool complete`` as a user drives it: every sampling flag, chat with a system message, and a
prompt too long for a command line from stdin or a file."""

from __future__ import annotations

import json

import pytest
from cli_run import clean_error, ovpool
from click.testing import CliRunner

from ovpool.cli import main
from ovpool.client import Client
from ovpool.completion import Completion, Usage
from ovpool.testing.pool import broker, fast_heartbeats, free_endpoint, null_worker, wait_for_workers

LONG = " ".join(f"w{i}" for i in range(50_000))  # 50,000 words: ~340 kB, past ARG_MAX per argument


@pytest.fixture(scope="module")
def pool():
    """A broker and a null worker (a word is a token there) that takes 60,000-token prompts."""
    endpoint = free_endpoint()
    with fast_heartbeats(0.2), broker(endpoint), \
            null_worker(endpoint, model="tiny", extra=("--set", "max_prompt_tokens=60000")), \
            Client(endpoint) as client:
        wait_for_workers(client, 1)
        yield endpoint, client


def complete(endpoint: str, *args: str, stdin: str | None = None) -> dict:
    result = ovpool("complete", *args, "--broker", endpoint, "--json", stdin=stdin)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


class RecordingClient:
    """Stands in for ovpool.client.Client: records what `ovpool complete` asks for."""

    calls: list = []

    def __init__(self, broker, **kwargs):
        self.calls.append(("connect", broker, kwargs.get("model")))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def complete(self, prompt, **sampling):
        self.calls.append(("complete", prompt, sampling))
        return Completion(text="ok", token_ids=[1], finish_reason="stop", usage=Usage(1, 1))


def test_sampling_flags_reach_the_request(monkeypatch):
    monkeypatch.setattr("ovpool.client.Client", RecordingClient)
    RecordingClient.calls = []
    result = CliRunner().invoke(main, ["complete", "hello", "--broker", "tcp://h:1", "--model", "m",
                                       "--max-tokens", "5", "--temperature", "0.7", "--top-k", "3",
                                       "--top-p", "0.5", "--seed", "11", "--stop", "END", "--stop", "\n\n",
                                       "--ignore-eos"])
    assert result.exit_code == 0 and result.output == "ok\n", result.output
    assert RecordingClient.calls == [
        ("connect", "tcp://h:1", "m"),
        ("complete", "hello", {"max_tokens": 5, "temperature": 0.7, "top_k": 3, "top_p": 0.5, "seed": 11,
                               "stop": ["END", "\n\n"], "ignore_eos": True, "response_format": None})]


def test_generate_takes_the_same_sampling_flags(tiny_model):
    from ovpool.worker.engine import Engine

    params = {"max_tokens": 8, "temperature": 0.9, "top_k": 5, "top_p": 0.8, "seed": 3}
    with Engine(tiny_model()) as engine:
        expected = engine.complete("hello", **params).text
    out = ovpool("generate", "hello", "--model", str(tiny_model()), "--max-tokens", "8", "--temperature",
                 "0.9", "--top-k", "5", "--top-p", "0.8", "--seed", "3")
    assert out.returncode == 0 and out.stdout == expected + "\n", out.stderr


def test_help_explains_each_sampling_flag():
    out = ovpool("complete", "--help").stdout
    for flag in ("--stop", "--top-p", "--top-k", "--seed", "--chat", "--system", "--prompt-file"):
        assert flag in out
    assert "same seed gives the same tokens" in " ".join(out.split())


def test_chat_with_a_system_message(pool):
    endpoint, client = pool
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    # The null worker draws from (seed, text), and the text of chat messages is their contents.
    expected = client.chat(messages, max_tokens=4, seed=5).token_ids
    assert complete(endpoint, "hi there", "--system", "be brief", "--max-tokens", "4", "--seed", "5")[
        "token_ids"] == expected != client.complete("hi there", max_tokens=4, seed=5).token_ids
    assert complete(endpoint, "hi there", "--chat", "--max-tokens", "4", "--seed", "5")["token_ids"] == \
        client.chat(messages[1:], max_tokens=4, seed=5).token_ids


def test_a_50000_word_prompt_from_stdin_or_a_file(pool, tmp_path):
    endpoint, _ = pool
    assert complete(endpoint, "-", "--max-tokens", "2", stdin=LONG)["usage"]["prompt_tokens"] == 50_000
    path = tmp_path / "prompt.txt"
    path.write_text(LONG)
    assert complete(endpoint, f"@{path}", "--max-tokens", "2")["usage"]["prompt_tokens"] == 50_000
    assert complete(endpoint, "--prompt-file", str(path), "--max-tokens", "2")["usage"]["prompt_tokens"] \
        == 50_000


def test_a_prompt_given_twice_missing_or_unreadable_is_a_usage_error(tmp_path):
    clean_error(ovpool("complete"), "give the prompt once", "--prompt-file")
    clean_error(ovpool("complete", "x", "--prompt-file", "-"), "give the prompt once")
    clean_error(ovpool("complete", f"@{tmp_path / 'nope.txt'}"), "cannot read the prompt file",
                "nope.txt", "No such file")
    clean_error(ovpool("complete", "x", "--top-p", "1.5"), "--top-p", "1.5")
