"""Several models in one `ovpool serve`: the catalog, its workers' command lines, the unloaded phase."""

from __future__ import annotations

import pytest

from ovpool.errors import ConfigError, ModelNotFoundError
from ovpool.models import model_name
from ovpool.serve.catalog import ModelEntry, catalog
from ovpool.serve.spec import PoolSpec
from ovpool.serve.supervisor import Supervisor, WorkerPhase


def test_model_names_come_from_name_equals_path_an_alias_or_the_files_stem():
    assert model_name("chat=/m/qwen.gguf") == ("chat", "/m/qwen.gguf")
    assert model_name("SmolLM2") == ("smollm2", "SmolLM2")
    assert model_name("/m/qwen2.5-7b.Q4_K_M.gguf") == ("qwen2.5-7b.Q4_K_M", "/m/qwen2.5-7b.Q4_K_M.gguf")
    with pytest.raises(ModelNotFoundError, match="NAME=PATH"):
        model_name("=/m/x.gguf")


def test_a_models_dir_serves_every_gguf_by_its_stem_and_a_name_twice_is_refused(tmp_path):
    for name in ("b.gguf", "a.gguf", "notes.txt"):
        (tmp_path / name).write_bytes(b"GGUF")
    assert [(m.name, m.source) for m in catalog(("smollm2",), str(tmp_path), None)] == [
        ("smollm2", "smollm2"), ("a", str(tmp_path / "a.gguf")), ("b", str(tmp_path / "b.gguf"))]
    with pytest.raises(ConfigError, match="'a' is given twice"):
        catalog(("a=smollm2",), str(tmp_path), None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="holds no .gguf"):
        catalog((), str(tmp_path / "empty"), None)


def test_a_models_file_sets_each_models_own_settings(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text('[models.chat]\npath = "smollm2"\nserved_names = ["gpt-4o-mini"]\nslots = 2\n'
                    'pinned = true\nkeep_alive = -1\n\n[models.base]\npath = "m/base.gguf"\n'
                    'devices = ["GPU.0"]\n')
    chat, base = catalog((), None, str(path))
    assert chat == ModelEntry("chat", "smollm2", ("gpt-4o-mini",), 2, (), -1.0, True)
    assert base == ModelEntry("base", str(tmp_path / "m/base.gguf"), devices=("GPU.0",))
    path.write_text('[models.x]\npath = "smollm2"\nslot = 2\n')
    with pytest.raises(ConfigError, match=r"\[models.x\]: unknown field\(s\) slot"):
        catalog((), None, str(path))
    path.write_text('[models.x]\npath = "smollm2"\nkeep_alive = "5m"\n')
    with pytest.raises(ConfigError, match="keep_alive must be a number >= -1"):
        catalog((), None, str(path))


def test_a_models_file_that_is_not_text_is_a_config_error_naming_it(tmp_path):
    path = tmp_path / "models.toml"
    path.write_bytes(b"[models.x]\npath = '\xff\xfe'\n")  # was a UnicodeDecodeError traceback
    with pytest.raises(ConfigError) as err:
        catalog((), None, str(path))
    assert str(err.value) == f"--models {str(path)!r} is not valid TOML: not UTF-8 text (byte 19)"


@pytest.mark.parametrize("field, match", [
    ("keep_alive = nan", r"\[models.x\]: keep_alive must be a number >= -1, not nan"),
    ("keep_alive = inf", r"\[models.x\]: keep_alive must be a number >= -1, not inf"),
    ("slots = 1025", r"\[models.x\]: slots must be a number >= 1 and <= 1024, not 1025"),
    ("slots = 0", r"\[models.x\]: slots must be a number >= 1"),
    ('pinned = "no"', r"\[models.x\]: pinned must be true or false, not 'no'"),
    ("pinned = 1", r"\[models.x\]: pinned must be true or false, not 1"),
    (f'served_names = ["{"n" * 257}"]', r"\[models.x\]: served_names must each be 1 to 256 characters"),
])
def test_a_models_files_out_of_range_field_is_a_config_error_naming_model_and_field(tmp_path, field, match):
    path = tmp_path / "models.toml"
    path.write_text(f'[models.x]\npath = "smollm2"\n{field}\n')
    with pytest.raises(ConfigError, match=match):
        catalog((), None, str(path))


def test_a_model_name_longer_than_requests_may_name_is_refused_at_start(tmp_path):
    from ovpool.bounds import MAX_NAME_CHARS

    long = "n" * (MAX_NAME_CHARS + 1)
    path = tmp_path / "models.toml"
    path.write_text(f'[models.{long}]\npath = "smollm2"\n')
    with pytest.raises(ConfigError, match=f"the model's name must be 1 to {MAX_NAME_CHARS} characters"):
        catalog((), None, str(path))
    with pytest.raises(ConfigError, match=f"NAME must be at most {MAX_NAME_CHARS} characters"):
        catalog((f"{long}=smollm2",), None, None)
    ok = "n" * MAX_NAME_CHARS
    path.write_text(f'[models.{ok}]\npath = "smollm2"\nserved_names = ["m{ok[1:]}"]\nslots = 1024\n')
    assert catalog((), None, str(path))[0].slots == 1024
    assert catalog((f"{ok}=smollm2",), None, None)[0].name == ok


def test_several_models_get_a_worker_per_model_and_device_each_answering_to_its_name():
    spec = PoolSpec(models=catalog(("smollm2", "g=gemma3-270m"), None, None), devices=("CPU", "GPU.0"))
    assert list(spec.workers()) == ["smollm2:CPU", "smollm2:GPU.0", "g:CPU", "g:GPU.0"]
    argv = spec.worker_argv("g:GPU.0", "GPU.0", spec.models[1])
    assert argv[argv.index("--model") + 1] == "gemma3-270m"
    assert argv[argv.index("--served-name") + 1] == "g"
    assert [p.name for p in spec.policies()] == ["smollm2", "g"]
    one = PoolSpec()  # one model: named by its device, always loaded, as before
    assert list(one.workers()) == ["CPU"] and one.policies()[0].pinned and not one.on_demand


def test_an_unloaded_worker_starts_only_when_loaded_and_its_unload_exit_is_not_restarted():
    sup = Supervisor({"a:CPU": "CPU"}, unloaded=frozenset({"a:CPU"}))
    assert sup.due(0.0) == [] and sup.state("a:CPU") is WorkerPhase.UNLOADED
    sup.load("a:CPU", 1.0)
    assert sup.due(1.0) == ["a:CPU"]
    sup.started("a:CPU", 10, 1.0)
    sup.ready("a:CPU")
    assert sup.unload("a:CPU", "idle") is False  # running: its exit is awaited
    assert sup.exited("a:CPU", 0, 2.0) is WorkerPhase.UNLOADED
    assert sup.due(100.0) == [] and sup.describe("a:CPU")["reason"] == "unloaded: idle"


def test_status_lists_each_on_demand_model_with_its_state_and_loads(capsys):
    from ovpool.cli.status import print_status

    entry = {"host": "h", "name": "b:CPU", "state": "unloaded", "model": "b", "residency": "unloaded",
             "pinned": 0, "loads": 2, "unloads": 2, "waiting_s": 0.0, "keep_alive_s": 0.0,
             "keep_alive_from": "request", "memory_mib": 0.0,
             "residency_reason": "idle for its keep-alive of 0 s (its latest request's keep_alive)"}
    print_status({"uptime_s": 3, "in_flight": 0, "queues": {}, "workers": [], "counters": {},
                  "supervised": [entry]})
    out = capsys.readouterr().out
    assert "models" in out and "idle for its keep-alive" in out and "0s (request)" in out
    assert "b:CPU: unloaded" not in out  # an unloaded model is no worker failing to start


def test_a_model_whose_worker_was_drained_by_hand_loads_again_on_demand():
    from ovpool.broker.residents import ModelState
    from ovpool.serve.loads import ModelLoads

    spec = PoolSpec(models=catalog(("a", "b"), None, None), backend="null")
    sup = Supervisor({n: d for n, (_, d) in spec.workers().items()}, unloaded=frozenset(spec.workers()))
    loads = ModelLoads(spec, sup)
    loads.step(0.0, {"queues": {"a": 1}}, {})
    assert sup.due(0.0) == ["a:CPU"]
    sup.started("a:CPU", 10, 0.0)
    sup.ready("a:CPU")
    loads.step(1.0, {"queues": {}}, {"a:CPU": {"active": 0}})
    assert loads.residency.state("a") is ModelState.LOADED
    sup.draining("a:CPU", "retire")  # `ovpool drain a:CPU`
    sup.exited("a:CPU", 0, 2.0)
    loads.step(3.0, {"queues": {}}, {})
    assert loads.residency.state("a") is ModelState.UNLOADED
    loads.step(4.0, {"queues": {"a": 1}}, {})
    assert sup.due(4.0) == ["a:CPU"]


def test_unloading_a_model_drains_its_worker_by_its_exact_id_not_its_bare_name():
    from ovpool.broker.residents import ModelState
    from ovpool.serve.loads import ModelLoads

    spec = PoolSpec(models=catalog(("a", "b"), None, None), backend="null")
    sup = Supervisor({n: d for n, (_, d) in spec.workers().items()}, unloaded=frozenset(spec.workers()))
    drained: list[str] = []
    loads = ModelLoads(spec, sup, drained.append)
    loads.step(0.0, {"queues": {"a": 1}}, {})
    sup.started("a:CPU", 10, 0.0)
    sup.ready("a:CPU")
    mine = {"a:CPU": {"active": 0, "id": "a:CPU@hostA:10"}}
    loads.step(1.0, {"queues": {}}, mine)
    assert loads.residency.state("a") is ModelState.LOADED
    order = {"id": "o1", "model": "a", "action": "unload"}
    loads.step(2.0, {"queues": {}, "model_orders": [order]}, mine)
    # the bare "a:CPU" would drain host B's a:CPU at the broker too
    assert drained == ["a:CPU@hostA:10"]
    assert loads.step(3.0, {"queues": {}, "model_orders": [order]}, mine) == ["a:CPU"]


def test_a_pool_whose_every_model_is_bad_is_refused_before_it_starts(tmp_path):
    from ovpool.serve import preflight

    (tmp_path / "text.gguf").write_text("not a model")
    spec = PoolSpec(models=catalog((f"a={tmp_path / 'missing.gguf'}", f"b={tmp_path / 'text.gguf'}"),
                                   None, None), bind=None)
    with pytest.raises(ConfigError, match="no model can be served: a: .* does not exist.*; b: .*not a GGUF"):
        preflight.check(spec)
    good = PoolSpec(models=(*spec.models, ModelEntry("c", "smollm2")), bind=None)
    assert sorted(preflight.check(good)) == ["a", "b"]  # the others serve; these are failed


def test_serve_follows_a_served_names_keep_alive_and_sums_its_workers_memory():
    from ovpool.broker.residents import ModelState
    from ovpool.serve.loads import ModelLoads

    spec = PoolSpec(models=(ModelEntry("a", "a", served_names=("gpt",)), ModelEntry("b", "b")),
                    backend="null", devices=("CPU", "CPU"))
    sup = Supervisor({n: d for n, (_, d) in spec.workers().items()}, unloaded=frozenset(spec.workers()))
    idle_reply = {"workers": [{"id": "a:CPU#0@h:10", "active": 0, "draining": True}]}
    loads = ModelLoads(spec, sup, lambda worker_id: idle_reply)
    loads.step(0.0, {"queues": {"a": 1}}, {})
    for pid, name in enumerate(("a:CPU#0", "a:CPU#1"), 10):
        sup.started(name, pid, 0.0)
        sup.ready(name)
    mine = {"a:CPU#0": {"active": 0, "id": "a:CPU#0@h:10"}, "a:CPU#1": {"active": 0, "id": "a:CPU#1@h:11"}}
    memory = {"a:CPU#0": 100 << 20, "a:CPU#1": 50 << 20}
    # Loaded and idle, its latest request (by a served name) asked for 0: it unloads; the drain's
    # reply shows #0 idle, so #0 stops in this round, #1 once a STATUS shows it idle.
    assert loads.step(1.0, {"queues": {}, "keep_alive": {"gpt": 0.0}}, mine, memory) == ["a:CPU#0"]
    entry = loads.describe("a:CPU#0", 1.0)
    assert (entry["keep_alive_s"], entry["keep_alive_from"], entry["memory_mib"]) == (0.0, "request", 150.0)
    assert loads.residency.state("a") is ModelState.UNLOADING
    loads.stopped("a:CPU#0")
    assert loads.step(2.0, {"queues": {}}, mine) == ["a:CPU#1"]
