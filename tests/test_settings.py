import pytest
from click.testing import CliRunner

from ovpool.cli import main
from ovpool.errors import InvalidSettingError, UnknownSettingError
from ovpool.settings import REGISTRY, Settings, parse_assignments


def test_flag_beats_env_beats_default():
    env = {"OVPOOL_DEVICE": "GPU.1", "OVPOOL_SLOTS": "3"}
    s = Settings.resolve({"device": "GPU.0"}, env=env)
    assert (s.device, s.source("device")) == ("GPU.0", "flag")
    assert (s.slots, s.source("slots")) == (3, "env")
    assert (s.attention, s.source("attention")) == ("auto", "default")


def test_types_are_parsed_from_strings():
    s = Settings.resolve({"stateful": "off", "cache_only": "1", "slots": "4"}, env={})
    assert s.stateful is False and s.cache_only is True and s.slots == 4


def test_unknown_name_lists_valid_names():
    with pytest.raises(UnknownSettingError) as err:
        Settings.resolve({"devcie": "CPU"}, env={})
    assert "devcie" in str(err.value) and "device" in str(err.value)


@pytest.mark.parametrize("name,value,needle", [
    ("attention", "flash", "sdpa, manual"),
    ("stateful", "maybe", "on/off"),
    ("slots", "many", "int"),
    ("slots", "0", "minimum"),
])
def test_bad_value_names_setting_and_allowed(name, value, needle):
    with pytest.raises(InvalidSettingError) as err:
        Settings.resolve({name: value}, env={})
    assert name in str(err.value) and needle in str(err.value)


@pytest.mark.parametrize("name, value, problem", [
    # NaN compares false with every bound: it passed, and connect_timeout_s=nan waited for ever
    ("connect_timeout_s", "nan", "'nan' is not a valid float (a number >= 0.01)"),
    ("stream_stall_s", "NaN", "'NaN' is not a valid float (a number >= 0.01)"),
    # past what the wire holds: slots=1e23 crashed every worker start in msgpack (OverflowError)
    ("slots", "99999999999999999999999", "'99999999999999999999999' is above the maximum 1024"),
    ("slots", "1025", "'1025' is above the maximum 1024"),  # the most the broker fills
    ("metrics_port", "70000", "'70000' is above the maximum 65535"),  # a traceback from bind()
    ("queue_limit", str(2**63), f"'{2**63}' is above the maximum {2**63 - 1}"),
])
def test_a_value_no_process_can_use_is_refused_naming_the_setting(name, value, problem):
    with pytest.raises(InvalidSettingError) as err:
        Settings.resolve({name: value}, env={})
    assert str(err.value) == f"setting {name}: {problem}"
    env = f"OVPOOL_{name.upper()}"
    with pytest.raises(InvalidSettingError, match=f"environment variable {env}=.*; fix or unset {env}"):
        Settings.resolve(env={env: value})


def test_bad_env_value_is_an_error_too():
    with pytest.raises(InvalidSettingError, match="kv_cache_precision"):
        Settings.resolve(env={"OVPOOL_KV_CACHE_PRECISION": "int3"})


def test_explicit_default_has_same_graph_values_as_unset():
    unset = Settings.resolve(env={})
    explicit = Settings.resolve({"attention": "auto", "stateful": "on"}, env={})
    assert unset.graph_values() == explicit.graph_values()
    assert explicit.source("attention") == "flag"


def test_graph_values_only_hold_graph_settings():
    graph = Settings.resolve(env={}).graph_values()
    assert set(graph) == {s.name for s in REGISTRY.values() if s.graph}
    assert "device" not in graph and "inference_precision" in graph


def test_parse_assignments_rejects_missing_equals():
    assert parse_assignments(["stateful=off"]) == {"stateful": "off"}
    with pytest.raises(InvalidSettingError, match="NAME=VALUE"):
        parse_assignments(["stateful"])


def test_settings_command_prints_table_and_json(monkeypatch):
    monkeypatch.setenv("OVPOOL_SLOTS", "5")
    runner = CliRunner()
    table = runner.invoke(main, ["settings", "--set", "attention=manual"])
    assert table.exit_code == 0, table.output
    assert "kv_cache_precision" in table.output and "OVPOOL_SLOTS" in table.output
    as_json = runner.invoke(main, ["settings", "--json", "--set", "attention=manual"])
    rows = {r["name"]: r for r in __import__("json").loads(as_json.output)}
    assert rows["attention"]["value"] == "manual" and rows["attention"]["source"] == "flag"
    assert rows["slots"]["value"] == 5 and rows["slots"]["source"] == "env"
