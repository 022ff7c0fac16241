"""Residency as pure logic: which models are loaded under a budget, keep-alive and pins."""

from __future__ import annotations

import pytest
from broker_helpers import C1, C2, LATE, W1, of, ready, submit
from hypothesis import given, settings
from hypothesis import strategies as st
from residency_world import NAMES, World

from ovpool import errors, timing
from ovpool.broker.residency import Residency
from ovpool.broker.residents import NEVER, Load, ModelPolicy, ModelState, Unload
from ovpool.broker.router import Router
from ovpool.errors import ConfigError
from ovpool.protocol import Error, Ping, Request, Supervised

events = st.lists(st.tuples(st.sampled_from(("submit", "ready", "stopping", "gone", "dispatch", "finish",
                                              "tick", "load", "unload")),
                            st.sampled_from(NAMES)), max_size=80)
policies = st.lists(st.tuples(st.sampled_from((NEVER, 0.0, 60.0, 300.0)), st.booleans()),
                    min_size=3, max_size=3)


@settings(max_examples=300, deadline=None)
@given(events, policies, st.sampled_from((1, 2, 3, None)))
def test_never_over_budget_never_unloads_a_busy_model_and_every_request_is_served(
        trace, kinds, max_loaded):
    models = [ModelPolicy(n, keep, pin) for n, (keep, pin) in zip(NAMES, kinds, strict=True)]
    pins = sum(p.pinned for p in models)
    if max_loaded is not None and pins and pins >= max_loaded and len(models) > max_loaded:
        with pytest.raises(ConfigError, match="pinned models"):
            Residency(models, max_loaded)
        return
    world = World(models, max_loaded)
    world.observe()
    for event in trace:
        world.step(event)
    world.settle()


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 16), st.integers(1, 10))
def test_concurrent_first_requests_for_a_cold_model_cause_one_load(requests, observations):
    world = World([ModelPolicy(n) for n in NAMES], max_loaded=2)
    for _ in range(requests):
        world.step(("submit", "a"))
    for _ in range(observations):
        world.observe()
    assert world.loads == ["a"]


def test_the_least_recently_used_idle_model_unloads_to_make_room():
    world = World([ModelPolicy(n) for n in NAMES], max_loaded=2)
    for name in ("a", "b"):
        world.step(("submit", name))
        for kind in ("ready", "dispatch", "finish"):
            world.step((kind, name))
        world.now += 1
    world.step(("submit", "a"))  # a is used again: b is now the least recent
    for kind in ("dispatch", "finish"):
        world.step((kind, "a"))
    world.queued["c"] = 1
    assert world.observe() == [Unload("b", "least recently used, making room for 'c' (max_loaded=2)")]
    assert world.observe() == []  # c waits for b to go; no second victim
    world.step(("gone", "b"))
    assert world.loads[-1] == "c" and world.r.state("c") is ModelState.LOADING


def test_the_models_asleep_are_listed_most_recently_used_first():
    # What serve's spare process reads ahead: the likeliest next loads first.
    world = World([ModelPolicy(n) for n in NAMES], max_loaded=1)
    assert world.r.asleep() == list(NAMES)  # none used yet: catalog order
    for previous, name in zip((None, *NAMES[:-1]), NAMES, strict=True):
        world.step(("submit", name))
        if previous is not None:  # it unloads to make room
            world.step(("gone", previous))
        for kind in ("ready", "dispatch", "finish"):
            world.step((kind, name))
        world.now += 1
    assert world.r.asleep() == ["b", "a"]

def test_a_busy_model_is_not_unloaded_until_its_requests_end():
    world = World([ModelPolicy(n) for n in NAMES], max_loaded=1)
    world.step(("submit", "a"))
    world.step(("ready", "a"))
    world.step(("dispatch", "a"))  # a long stream runs on a
    world.step(("submit", "b"))
    assert world.observe() == []  # b waits: a streams
    assert world.r.state("a") is ModelState.LOADED and world.r.state("b") is ModelState.UNLOADED
    world.active["a"] = 0  # the stream ended
    assert world.observe() == [Unload("a", "least recently used, making room for 'b' (max_loaded=1)")]


def test_keep_alive_unloads_an_idle_model_and_never_a_pinned_one():
    world = World([ModelPolicy("a", 60.0), ModelPolicy("b", 60.0, pinned=True), ModelPolicy("c", NEVER)],
                  max_loaded=None)
    assert world.observe() == [Load("b")]  # a pin loads at once
    for name in ("a", "c"):
        world.step(("submit", name))
    for name in NAMES:
        for kind in ("ready", "dispatch", "finish"):
            world.step((kind, name))
    world.now += 59.0
    assert world.observe() == []
    world.now += 1.0
    assert world.observe() == [Unload("a", "idle for its keep-alive of 60 s")]
    world.now += 1e6
    assert world.observe() == []


def test_a_failed_model_is_not_loaded_again_and_others_go_on():
    world = World([ModelPolicy(n) for n in NAMES], max_loaded=1)
    world.step(("submit", "a"))
    world.r.failed("a", "not a GGUF file")
    world.queued["a"] = 0  # the broker failed them, naming why
    world.step(("submit", "b"))
    assert world.loads == ["a", "b"]
    assert world.r.describe("a", world.now)["residency"] == "failed"


# -- the broker's side: requests for a model a supervisor loads on demand wait for it ------------


def _report(state: str, reason: str = "") -> Supervised:
    return Supervised("h", 10, [{"name": "x:CPU", "state": "unloaded", "model": "x", "residency": state,
                                 "residency_reason": reason}])


def test_a_request_for_an_unloaded_model_waits_past_the_grace_and_goes_to_its_worker_once_loaded():
    r = Router(now=0.0)
    r.handle(C2, _report("unloaded"), LATE)
    assert r.handle(C1, submit("a", model="x"), LATE) == []  # queued, not refused
    later = LATE + timing.BROKER_GRACE_S + 1
    r.handle(C2, _report("loading"), later)  # serve reports twice a heartbeat
    r.handle(C1, Ping(["a"]), later)  # so does a waiting client
    r.tick(later)  # not an orphan: its supervisor loads it
    assert r.status(LATE)["queues"] == {"x": 1}
    out = r.handle(W1, ready(models=("x",)), later)
    assert [m.request_id for _, m in of(out, Request)] == ["a"]


def test_a_model_reported_failed_fails_what_waits_for_it_and_refuses_the_next_naming_why():
    r = Router(now=0.0)
    r.handle(C2, _report("loading"), LATE)
    assert r.handle(C1, submit("a", model="x"), LATE) == []
    (peer, err), = of(r.handle(C2, _report("failed", "model file 'x.gguf' is not a GGUF file"), LATE), Error)
    assert peer == C1 and err.code == errors.ModelNotFoundError.code and "not a GGUF file" in err.message
    (_, err), = r.handle(C1, submit("b", model="x"), LATE)
    assert err.message == "model 'x' cannot be loaded: model file 'x.gguf' is not a GGUF file"


def test_metrics_show_each_on_demand_models_state_loads_and_wait():
    from ovpool.broker.metrics import BrokerMetrics, BrokerObserver

    metrics = BrokerMetrics()
    BrokerObserver(metrics).tick({}, [], [{"name": "b:CPU", "state": "starting", "model": "b",
                                           "residency": "loading", "loads": 3, "unloads": 2,
                                           "waiting_s": 1.5}])

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert value("ovpool_model_state", model="b", state="loading") == 1
    assert value("ovpool_model_state", model="b", state="loaded") == 0
    assert (value("ovpool_model_loads", model="b"), value("ovpool_model_unloads", model="b")) == (3, 2)
    assert value("ovpool_model_load_wait_seconds", model="b") == 1.5


def test_an_ordered_load_loads_without_a_request_and_an_ordered_unload_waits_for_idle():
    world = World([ModelPolicy("a", NEVER), ModelPolicy("b", NEVER, pinned=True)], max_loaded=None)
    assert world.observe() == [Load("b")]
    world.step(("ready", "b"))
    world.r.order("a", "load", world.now)
    assert world.observe() == [Load("a")] and world.observe() == []
    world.step(("ready", "a"))
    world.step(("submit", "a"))
    world.step(("dispatch", "a"))
    world.r.order("a", "unload", world.now)
    world.r.order("b", "unload", world.now)  # pinned: never
    assert world.observe() == []  # a runs a request
    world.step(("finish", "a"))
    assert world.r.state("a") is ModelState.UNLOADING and world.r.state("b") is ModelState.LOADED


def test_on_cpu_a_load_starts_beside_the_exit_of_the_model_it_replaces_on_a_gpu_after_it():
    for device, overlaps in (("CPU", True), ("GPU.0", False)):
        world = World([ModelPolicy(n, devices=(device,)) for n in ("a", "b")], max_loaded=1)
        for kind in ("submit", "ready", "dispatch", "finish"):
            world.step((kind, "a"))
        world.step(("submit", "b"))
        assert world.r.state("a") is ModelState.UNLOADING and world.loads == ["a"]
        world.step(("stopping", "a"))  # idle, drained, told to exit
        assert world.loads == (["a", "b"] if overlaps else ["a"])
        world.step(("gone", "a"))
        assert world.loads == ["a", "b"]
