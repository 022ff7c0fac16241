"""The default's quality holds on every CPU class: greedy chat answers are the exact graph's (bf16
at the plugin's default made SmolLM2 answer "What is the capital of France?" with "L'Étoile, la
Marseillaise…"), and ``ovpool settings`` / ``ovpool status`` say what each ``auto`` resolved to."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ovpool import Engine
from ovpool.cli import main
from ovpool.cli.status import print_status
from ovpool.worker.graph.cpu_class import CpuInfo

EXACT = {"inference_precision": "f32", "kv_cache_precision": "f32"}
QUESTIONS = ["What is the capital of France?", "Hello", "What is 2+2?", "How many days are in a week?"]


def answers(engine: Engine) -> list[str]:
    return [engine.chat([{"role": "user", "content": q}], max_tokens=16).text for q in QUESTIONS]


@pytest.mark.slow
def test_smollm2_answers_at_the_default_are_the_exact_graphs(smollm2_path):
    with Engine(smollm2_path, cache_dir="") as default:
        assert {k: default.graph_settings[k] for k in EXACT} == EXACT  # the default is the exact graph
        got = answers(default)
    assert "Paris" in got[0] and got[1].startswith("Hello! How can I")
    assert "4" in got[2] and "7" in got[3]


def test_settings_show_what_each_auto_resolved_to_on_this_host():
    rows = {r["name"]: r for r in json.loads(CliRunner().invoke(main, ["settings", "--json"]).output)}
    assert rows["inference_precision"]["value"] == "auto"
    assert rows["inference_precision"]["resolved"] == "f32"  # on every CPU class
    assert (rows["zero_points"]["resolved"], rows["kquant_requant"]["resolved"]) == ("float", "none")
    assert rows["activations"]["resolved"] == "float"  # int8 stays opt-in on every class (cpu_class)
    assert rows["kv_cache_precision"]["resolved"] == "f32" and rows["prefix_cache"]["resolved"] == "on"
    amx_f32 = CpuInfo.read().class_name == "AMX"  # no decode graph there at f32 (cpu_class)
    expected = "off on this CPU class" if amx_f32 else "on for models"
    assert rows["decode_graph"]["resolved"].startswith(expected)
    assert "resolved" not in rows["slots"]  # not an auto
    table = CliRunner().invoke(main, ["settings", "--set", "inference_precision=bf16"]).output
    words = " ".join(table.split())  # where the terminal's width folds a line depends on the host
    assert "int8 activations:" in words and "auto → f16" in words


def test_settings_on_a_device_this_host_cannot_open_say_so_without_a_traceback():
    out = CliRunner().invoke(main, ["settings", "--set", "device=GPU.9"])
    words = " ".join(out.output.split())
    assert out.exit_code == 0 and out.exception is None, out.output
    assert "GPU.9: cannot be opened on this host, so no auto is resolved (" in words
    assert "value: auto source" in words or "│ auto " in out.output  # shown unresolved, not "auto →"


def test_status_shows_each_workers_resolved_graph_settings(capsys):
    worker = {"id": "w1", "device": "CPU", "active": 0, "slots": 8, "models": ["smollm2"],
              "load": {"outcome": "hit", "seconds": 0.4, "batching": None,
                       "graph": {"inference_precision": "f32", "zero_points": "float"}}}
    print_status({"uptime_s": 3, "in_flight": 0, "queues": {}, "workers": [worker], "counters": {}})
    assert "w1: graph inference_precision=f32 zero_points=float" in capsys.readouterr().out
