"""Settings are scoped and typed: each process gets a frozen config of its scope, nothing below the
CLI reads the environment, and docs/configuration.md is the registry's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ovpool
from ovpool.cli.settings_cmd import reference_page
from ovpool.config import CONFIGS, BrokerConfig, ClientConfig, GraphConfig, WorkerConfig
from ovpool.errors import InvalidSettingError, UnknownSettingError
from ovpool.settings import GRAPH, REGISTRY, VARIABLES, Settings, heartbeat_interval_s

PACKAGE = Path(ovpool.__file__).parent
ROOT = PACKAGE.parent


@pytest.mark.parametrize("scope", sorted(CONFIGS))
def test_each_config_holds_exactly_the_settings_of_its_scope(scope):
    assert CONFIGS[scope].names() == [s.name for s in REGISTRY.values() if scope in s.scopes]
    assert CONFIGS[scope]().values() == {n: REGISTRY[n].default for n in CONFIGS[scope].names()}


def test_a_config_is_built_once_from_the_resolved_settings_and_is_frozen():
    settings = Settings.resolve({"queue_limit": "2", "attention": "sdpa", "slots": "3"}, env={})
    broker, worker = BrokerConfig.of(settings), WorkerConfig.of(settings)
    assert broker.queue_limit == 2 and worker.slots == 3 and worker.graph.attention == "sdpa"
    with pytest.raises(AttributeError):
        broker.queue_limit = 3  # type: ignore[misc]
    assert worker.with_graph(attention="paged").graph.attention == "paged"
    assert worker.graph.attention == "sdpa"


def test_graph_values_are_those_the_fingerprint_always_had():
    settings = Settings.resolve({"kv_cache_precision": "u8", "stateful": "off"}, env={})
    assert GraphConfig.of(settings).values() == settings.graph_values()
    assert list(GraphConfig().values()) == [s.name for s in REGISTRY.values() if GRAPH in s.scopes]


def test_plain_values_are_parsed_and_a_setting_of_another_scope_is_named():
    assert WorkerConfig.from_values({"slots": "4", "q4_storage": "i8"}).graph.q4_storage == "i8"
    with pytest.raises(UnknownSettingError, match="setting queue_limit is not a client setting"):
        ClientConfig.from_values({"queue_limit": 2})
    with pytest.raises(InvalidSettingError, match="setting slots: 'many' is not a valid int"):
        WorkerConfig().replace(slots="many")


def test_the_builder_never_reads_the_environment(monkeypatch):
    from ovpool.worker.graph.compile_settings import decode_threads, resolve_auto

    monkeypatch.setenv("OVPOOL_ZERO_POINTS", "rounded")
    monkeypatch.setenv("OVPOOL_DECODE_THREADS", "3")
    assert resolve_auto(GraphConfig(), "CPU")["zero_points"] != "rounded"
    assert resolve_auto({"zero_points": "rounded"}, "CPU")["zero_points"] == "rounded"
    assert decode_threads(WorkerConfig().decode_threads, "CPU") == 0
    with pytest.raises(TypeError, match="a GraphConfig"):
        resolve_auto(None, "CPU")


def test_a_client_facade_resolves_its_flags_with_the_environment(monkeypatch):
    monkeypatch.setenv("OVPOOL_CONNECT_TIMEOUT_S", "7")
    assert ClientConfig.coerce({"broker": "tcp://h:1"}) == ClientConfig("tcp://h:1", 7.0)
    given = ClientConfig(connect_timeout_s=1.0)
    assert ClientConfig.coerce(given) is given


def test_a_bad_heartbeat_interval_names_its_variable():
    assert heartbeat_interval_s({}) == 1.0
    assert heartbeat_interval_s({"OVPOOL_HEARTBEAT_INTERVAL_S": "0.2"}) == 0.2
    for bad in ("fast", "0", "-1"):
        with pytest.raises(InvalidSettingError, match="OVPOOL_HEARTBEAT_INTERVAL_S="):
            heartbeat_interval_s({"OVPOOL_HEARTBEAT_INTERVAL_S": bad})


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_only_the_settings_and_cli_layers_read_the_environment():
    allowed = {*(PACKAGE / "settings").glob("*.py"), *(PACKAGE / "cli").glob("*.py")}
    readers = [str(p.relative_to(ROOT)) for p in _sources()
               if p not in allowed and re.search(r"os\.environ|getenv\(", p.read_text())]
    assert readers == []


def test_every_ovpool_variable_named_in_the_code_is_registered():
    known = {s.env for s in REGISTRY.values()} | set(VARIABLES)
    named = {m for p in _sources() for m in re.findall(r"\bOVPOOL_[A-Z0-9_]*[A-Z0-9]\b", p.read_text())}
    named -= {"OVPOOL_CACHE_TEST_PAUSED"}  # the hook's message, not a variable
    assert sorted(named - known) == []


def test_the_configuration_page_is_generated_from_the_registry():
    page = ROOT / "docs" / "configuration.md"
    assert page.read_text() == reference_page(), \
        "docs/configuration.md is stale: run `ovpool settings --markdown > docs/configuration.md`"


def test_the_configuration_page_says_what_every_auto_resolves_to_on_each_cpu_class():
    page = reference_page()
    table = page[page.index("## What `auto` resolves to on each CPU class"):page.index("## Environment")]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \|(.*)\|$", table, re.M)}
    autos = {s.name for s in REGISTRY.values() if s.default == "auto"}
    assert set(rows) == autos
    assert all(cell.strip() and cell.strip() != "auto" for row in rows.values() for cell in row.split("|"))
    assert rows["decode_graph"].split("|")[-1].strip() == "off"  # AMX at f32 (cpu_class.choose)
