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
