"""Residency's byte budget (max_loaded_mb, per device, from the workers' measured PSS): never over
it once settled but for one model alone, never unloading a busy model, every request served."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from residency_world import NAMES, World

from ovpool.broker.residents import MIB, NEVER, Load, ModelPolicy, ModelState, Unload
from ovpool.serve.memory import MemoryReader, pss_bytes

events = st.lists(st.tuples(st.sampled_from(("submit", "ready", "stopping", "gone", "dispatch", "finish",
                                              "tick", "load", "unload")),
                            st.sampled_from(NAMES)), max_size=80)
devices = st.sampled_from((("CPU",), ("GPU.0",), ("CPU", "GPU.0")))
models = st.lists(st.tuples(st.sampled_from((NEVER, 0.0, 60.0)), st.booleans(), devices,
                            st.integers(1, 400)), min_size=3, max_size=3)


@settings(max_examples=300, deadline=None)
@given(events, models, st.integers(100, 1000), st.sampled_from((2, 3, None)))
def test_settled_within_the_byte_budget_but_for_one_model_alone_and_never_a_busy_unload(
        trace, kinds, budget_mib, max_loaded):
    policies = [ModelPolicy(n, keep, pin, devs) for n, (keep, pin, devs, _) in zip(NAMES, kinds, strict=True)]
    if max_loaded is not None and sum(p.pinned for p in policies) >= max_loaded:
        max_loaded = None  # pins over a count budget are refused at start (test_broker_residency)
    sizes = {n: size * MIB for n, (*_, size) in zip(NAMES, kinds, strict=True)}
    world = World(policies, max_loaded, budget_mib * MIB, sizes)
    world.observe()
    for event in trace:
        world.step(event)
    world.settle()  # every request served (World.settle raises if one still waits)
    for device in ("CPU", "GPU.0"):
        used, unpinned = world.used(device)
        assert used <= budget_mib * MIB or len(unpinned) <= 1, (device, used, unpinned)
        if used > budget_mib * MIB and unpinned and sizes[unpinned[0]] > budget_mib * MIB:
            assert any(n.model == unpinned[0] for n in world.notices)  # said, not silent


def _used(world: World, name: str) -> None:
    for kind in ("submit", "ready", "dispatch", "finish"):
        world.step((kind, name))
    world.now += 1


def test_over_the_budget_the_least_recently_used_idle_model_unloads():
    world = World([ModelPolicy(n) for n in NAMES], None, 1000 * MIB, {"a": 400 * MIB, "b": 400 * MIB,
                                                                       "c": 400 * MIB})
    _used(world, "a")
    _used(world, "b")
    world.step(("submit", "c"))  # c's size is not known yet: it loads, then the measure decides
    assert world.r.state("c") is ModelState.LOADING
    world.step(("ready", "c"))  # 1,200 MiB now: a, least recently used and idle, goes
    assert world.r.state("a") is ModelState.UNLOADING
    assert world.r.describe("a", world.now)["residency_reason"] == \
        "least recently used, over the budget (max_loaded_mb=1000 on CPU)"
    assert world.r.state("b") is ModelState.LOADED


def test_a_load_of_a_known_size_waits_for_room_and_a_busy_model_is_not_unloaded():
    world = World([ModelPolicy(n) for n in NAMES], None, 1000 * MIB, {"a": 600 * MIB, "b": 600 * MIB})
    _used(world, "a")
    _used(world, "b")  # b's measure: a unloads (over the budget), then a's size is known
    world.step(("gone", "a"))
    world.step(("submit", "b"))
    world.step(("dispatch", "b"))  # b runs a long request
    world.step(("submit", "a"))
    assert world.r.state("a") is ModelState.UNLOADED and world.r.state("b") is ModelState.LOADED
    assert world.observe() == []  # a waits: 600 + 600 > 1000 and b is busy
    world.step(("finish", "b"))
    assert world.r.state("b") is ModelState.UNLOADING  # b idle: it makes room for a
    reason = world.r.describe("b", world.now)["residency_reason"]
    assert reason == "least recently used, making room for 'a' (max_loaded_mb=1000 on CPU)"
    world.step(("gone", "b"))
    assert world.loads[-1] == "a"


def test_a_model_over_the_budget_alone_stays_loaded_and_is_reported_once():
    world = World([ModelPolicy("big"), ModelPolicy("small")], None, 100 * MIB,
                  {"big": 300 * MIB, "small": 50 * MIB})
    world.step(("submit", "big"))
    world.step(("ready", "big"))
    (notice,) = world.notices
    assert notice.model == "big" and "alone holds 300 MiB on CPU" in notice.text
    assert "over max_loaded_mb=100: it stays loaded and serves" in notice.text
    for kind in ("dispatch", "finish"):
        world.step((kind, "big"))
    assert world.observe() == [] and len(world.notices) == 1  # once a load, no unload of its own
    assert world.r.describe("big", world.now)["residency_reason"] == notice.text
    world.step(("submit", "small"))  # big is idle: it makes room, then small loads alone
    assert world.r.state("big") is ModelState.UNLOADING
    world.step(("gone", "big"))
    assert world.loads == ["big", "small"]


def test_budgets_are_per_device():
    world = World([ModelPolicy("a", devices=("CPU",)), ModelPolicy("b", devices=("GPU.0",))], None,
                  500 * MIB, {"a": 400 * MIB, "b": 400 * MIB})
    _used(world, "a")
    _used(world, "b")
    assert {world.r.state(n) for n in ("a", "b")} == {ModelState.LOADED}
    assert world.r.describe("a", world.now)["memory_mib"] == 400.0


def test_with_only_pins_on_its_device_a_model_loads_beside_them_over_the_budget():
    world = World([ModelPolicy("pin", pinned=True), ModelPolicy("a")], None, 500 * MIB,
                  {"pin": 450 * MIB, "a": 200 * MIB})
    assert world.observe() == [Load("pin")]
    world.step(("ready", "pin"))
    _used(world, "a")
    world.step(("gone", "a"))  # none: a is not unloaded, nothing else to make room with
    assert world.r.state("a") is ModelState.LOADED
    assert [n.model for n in world.notices] == ["a"]
    assert not any(isinstance(a, Unload) for a in world.observe())


def test_pss_is_read_from_proc_and_at_most_twice_a_heartbeat(tmp_path):
    import os

    assert pss_bytes(os.getpid()) > 1 << 20 and pss_bytes(2**22 + 12345) is None
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "smaps_rollup").write_text("Rss:  2048 kB\nPss:  1024 kB\n")
    reader = MemoryReader(interval_s=0.5, proc=tmp_path)
    assert reader.read(10.0, {"a:CPU": 7, "b:CPU": 8}) == {"a:CPU": 1 << 20}  # 8 is gone
    assert reader.read(10.4, {"a:CPU": 7}) is None
    assert reader.read(10.5, {"a:CPU": 7}) == {"a:CPU": 1 << 20}
