"""A hit's first pass, run on its import's thread (ovpool.worker.graph.first_pass): the start on a
hit builds nothing and compiles nothing, its first request runs no set-up pass of its own, and the
tokens are those of a start without it."""

import cache_toy
import openvino as ov
import openvino.opset13 as ops

from ovpool.cache import loader, prefetch
from ovpool.worker.engine import Engine
from ovpool.worker.graph import builder, first_pass


def test_a_hit_runs_its_first_pass_early_and_builds_and_compiles_nothing(tiny_model, tmp_path, monkeypatch):
    model = tiny_model()
    with Engine(model, cache_dir=tmp_path) as engine:
        assert engine.load_report["outcome"] == "wrote"
        expected = engine.complete("Hello", max_tokens=5, ignore_eos=True).token_ids
    calls = {"build": 0, "compile": 0, "pass": []}

    def counted(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(builder, "build_model", counted("build", builder.build_model))
    monkeypatch.setattr(loader, "compile_model", counted("compile", loader.compile_model))
    monkeypatch.setattr(ov.Core, "compile_model", counted("compile", ov.Core.compile_model))

    def passes(compiled):
        calls["pass"].append(compiled)
        return first_pass.one_token_pass(compiled)

    early = prefetch.start(model, "CPU", {}, tmp_path, first_pass=passes)  # as `ovpool generate` does
    with Engine(model, cache_dir=tmp_path, early=early) as hit:
        assert hit.load_report["outcome"] == "hit" and early.set_up.result() is True
        assert calls["pass"] == [hit.compiled]
        assert hit.complete("Hello", max_tokens=5, ignore_eos=True).token_ids == expected
    assert calls["build"] == calls["compile"] == 0


def test_the_first_pass_leaves_a_graph_with_other_ports_alone():
    assert first_pass.one_token_pass(ov.Core().compile_model(cache_toy.build(), "CPU")) is True
    past_lens = ops.parameter([-1], ov.Type.i32, name="past_lens")  # a paged graph's port
    paged_like = ov.Model([ops.result(ops.convert(past_lens, ov.Type.f32))], [past_lens])
    assert first_pass.one_token_pass(ov.Core().compile_model(paged_like, "CPU")) is False
    assert first_pass.for_warm_up("off", cores=16) is None
    assert first_pass.for_warm_up("idle", cores=4) is first_pass.one_token_pass
    assert first_pass.for_warm_up("idle", cores=2) is None  # no idle core to run it on
