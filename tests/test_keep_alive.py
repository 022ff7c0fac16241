"""Per-request keep_alive, as Ollama's API has it: parsed once at the edge (HTTP body, Client
keyword), carried by SUBMIT, kept per model by the broker (the last request wins) and followed by
residency; a real serve unloads a model its request gave a short keep-alive."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request

import pytest
from broker_helpers import C1, LATE, W1, ready, submit
from hypothesis import given, settings
from hypothesis import strategies as st
from residency_world import World
from serve_helpers import serve, wait_for

from ovpool import errors
from ovpool.api import anthropic, openai_responses
from ovpool.api.schema import parse_chat, parse_completion
from ovpool.broker.residents import NEVER, ModelPolicy, ModelState, Unload
from ovpool.broker.router import Router
from ovpool.client import Client
from ovpool.keep_alive import MAX_KEEP_ALIVE_S, parse
from ovpool.protocol import Error, Submit, decode, encode
from ovpool.submit import make_submit


@pytest.mark.parametrize(("value", "seconds"), [
    (None, None), (0, 0.0), (600, 600.0), (0.5, 0.5), (-1, NEVER), (-7.5, NEVER), ("10m", 600.0),
    ("1h30m", 5400.0), ("300ms", 0.3), ("1.5h", 5400.0), ("0", 0.0), ("-1m", NEVER), ("600", 600.0),
    (" 5s ", 5.0), ("2h45m30.5s", 9930.5), ("1500us", 0.0015)])
def test_ollamas_forms_are_seconds(value, seconds):
    assert parse(value) == seconds


@pytest.mark.parametrize("value", ["", "m", "5 m", "10x", "1e3", "--1s", "10m5", "5d", float("nan"),
                                   float("inf"), True, [1], {"s": 1}, MAX_KEEP_ALIVE_S * 2, 10**400])
def test_anything_else_is_refused_naming_the_field(value):
    with pytest.raises(errors.InvalidRequestError, match="^keep_alive: must be a number of seconds") as exc:
        parse(value)
    assert exc.value.param == "keep_alive"


@given(st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(("h", "m", "s", "ms"))), min_size=1,
                max_size=4))
def test_a_duration_is_the_sum_of_its_parts(parts):
    text = "".join(f"{n}{unit}" for n, unit in parts)
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3}
    assert parse(text) == pytest.approx(sum(n * scale[u] for n, u in parts))


def test_the_http_bodies_take_it_and_refuse_a_bad_one_with_its_name():
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert parse_chat({**chat, "keep_alive": "5m"}, 16).keep_alive == 300.0
    assert parse_completion({"model": "m", "prompt": "hi", "keep_alive": 0}).keep_alive == 0.0
    assert parse_chat(chat, 16).keep_alive is None
    with pytest.raises(errors.InvalidRequestError) as exc:
        parse_chat({**chat, "keep_alive": "soon"}, 16)
    assert exc.value.param == "keep_alive"
    # The other dialects take it as one of ovpool's extension fields.
    assert anthropic.parse({**chat, "max_tokens": 4, "keep_alive": "1m"}).keep_alive == 60.0
    assert openai_responses.parse({"model": "m", "input": "hi", "keep_alive": -1}, 16).keep_alive == NEVER


def test_the_client_sends_it_in_submit_and_refuses_a_bad_one_before_sending():
    msg = decode(encode(make_submit("hi", "m", None, {"max_tokens": 2, "keep_alive": "90s"})))
    assert msg.keep_alive_s == 90.0 and "keep_alive" not in msg.params
    assert decode(encode(make_submit("hi", "m", None, {}))).keep_alive_s is None
    with pytest.raises(errors.InvalidRequestError, match="keep_alive"):
        make_submit("hi", "m", None, {"keep_alive": "forever"})


def _keep(msg: Submit, seconds: float) -> Submit:
    return dataclasses.replace(msg, keep_alive_s=seconds)


def test_the_broker_keeps_the_last_requests_keep_alive_per_model_and_refuses_a_bad_one():
    r = Router(now=0.0)
    r.handle(W1, ready(models=("m",)), LATE)
    r.handle(C1, _keep(submit("a"), 600.0), LATE)
    assert r.status(LATE)["keep_alive"] == {"m": 600.0}
    r.handle(C1, _keep(submit("b"), -3.0), LATE)
    assert r.status(LATE)["keep_alive"] == {"m": NEVER}  # any negative: never
    r.handle(C1, submit("c"), LATE)  # the last request gave none: the model's own again
    assert r.status(LATE)["keep_alive"] == {}
    ((_, err),) = r.handle(C1, _keep(submit("d"), float("nan")), LATE)
    assert isinstance(err, Error) and err.code == errors.InvalidRequestError.code
    assert err.message.startswith("keep_alive_s: must be")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from((None, 0.0, 30.0, 120.0, NEVER)), st.integers(0, 200)),
                min_size=1, max_size=12))
def test_the_model_unloads_once_idle_for_its_last_requests_keep_alive(requests):
    world = World([ModelPolicy("a", 60.0), ModelPolicy("b", NEVER)], None)
    for keep, idle_s in requests:
        world.keep_alive = {} if keep is None else {"a": keep}
        if world.r.state("a") is ModelState.UNLOADING:
            world.step(("gone", "a"))
        for kind in ("submit", "ready", "dispatch", "finish"):
            world.step((kind, "a"))
        effective = 60.0 if keep is None else keep
        finished = world.now
        for _ in range(idle_s):
            world.now += 1.0
            if world.r.state("a") is not ModelState.LOADED:
                break
            world.observe()
        if world.r.state("a") is ModelState.UNLOADING:
            assert effective != NEVER and world.now - finished >= effective
            reason = world.r.describe("a", world.now)["residency_reason"]
            assert reason.endswith("(its latest request's keep_alive)") == (keep is not None)
        else:
            assert effective == NEVER or world.now - finished < effective
    assert world.r.state("b") is ModelState.UNLOADED and not any(
        isinstance(a, Unload) and a.model == "b" for a in world.observe())


def test_keep_alive_zero_unloads_right_after_the_request_and_a_pin_ignores_it():
    world = World([ModelPolicy("a", NEVER), ModelPolicy("p", NEVER, pinned=True)], None)
    world.keep_alive = {"a": 0.0, "p": 0.0}
    for name in ("a", "p"):
        for kind in ("submit", "ready", "dispatch"):
            world.step((kind, name))
    assert world.r.state("a") is ModelState.LOADED  # in flight: kept
    world.step(("finish", "a"))
    world.step(("finish", "p"))
    assert world.r.state("a") is ModelState.UNLOADING and world.r.state("p") is ModelState.LOADED
    assert world.r.describe("a", world.now)["keep_alive_from"] == "request"


def _post(port: int, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", method="POST",
                                     data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _entries(client: Client) -> dict[str, dict]:
    return {e["model"]: e for e in client.status()["supervised"] if "model" in e}


def _unloaded(client: Client, model: str) -> dict | None:
    """``model``'s entry once it has unloaded; the broker's copy of serve's entries may still be
    the one from before its load (unloaded, never loaded), hence the count of unloads."""
    entry = _entries(client)[model]
    return entry if entry["residency"] == "unloaded" and entry["unloads"] else None


@pytest.mark.slow
def test_a_served_model_unloads_after_its_requests_short_keep_alive(tmp_path):
    with serve(tmp_path, "--backend", "null", "--model", "a", "--model", "b", "--keep-alive", "-1",
               http=True) as served, Client(served.endpoint) as client:
        served.wait_service("http")
        chat = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        code, body = _post(served.http_port, {**chat, "keep_alive": "a while"})
        assert code == 400 and body["error"]["param"] == "keep_alive"
        code, body = _post(served.http_port, {**chat, "keep_alive": "1s"})
        assert code == 200 and body["choices"][0]["message"]["content"]
        entry = wait_for(lambda: _unloaded(client, "a"), 30, "a's keep-alive of 1 s to expire")
        assert entry["residency_reason"] == "idle for its keep-alive of 1 s (its latest request's keep_alive)"
        # Read from serve, not a pid kept from before (1 s may pass before a loaded host asks):
        # serve records the exit code and clears the pid once it has reaped the process.
        wait_for(lambda: (w := served.workers()["a:CPU"])["state"] == "unloaded" and w["pid"] is None
                 and w["last_exit"] is not None, 60, "a's worker process to exit")
        # The Client's keyword; 0: unloaded right after its request. b's own keep-alive is -1.
        reply = client.complete("hi", model="b", max_tokens=2, timeout=60, keep_alive=0)
        assert reply.usage.completion_tokens == 2
        wait_for(lambda: _unloaded(client, "b"), 30, "b to unload after it")
