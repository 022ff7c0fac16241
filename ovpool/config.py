"""Typed, frozen settings per process: built once from a resolved ``Settings`` and passed down.

Each process resolves its settings at its top (a CLI command, ``Engine(...)``, ``Client(...)``)
and hands each part only its scope's config; nothing below reads the environment. Each class's
fields are exactly the settings of its scope in the registry (tests/test_settings.py checks it),
with the registry's defaults.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from ovpool.errors import UnknownSettingError
from ovpool.settings import API, BROKER, CLIENT, GRAPH, REGISTRY, WORKER, Settings, lookup

C = TypeVar("C", bound="_Config")


def _default(name: str) -> Any:
    return field(default=REGISTRY[name].default)


class _Config:
    """Built from a resolved Settings (``of``) or from plain values (``from_values``: the registry's
    defaults for the rest, never the environment)."""

    SCOPE = ""

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name in REGISTRY]

    @classmethod
    def of(cls: type[C], settings: Settings) -> C:
        return cls(**{name: settings[name] for name in cls.names()})

    @classmethod
    def from_values(cls: type[C], values: Mapping[str, Any]) -> C:
        return cls().replace(**values)

    def replace(self: C, **changes: Any) -> C:
        """A copy with ``changes`` (each parsed and checked as its setting's flag would be)."""
        parsed = {}
        for name, raw in changes.items():
            setting = lookup(name)
            if setting.name not in self.names():
                raise UnknownSettingError(f"setting {setting.name} is not a {self.SCOPE} setting; "
                                          f"{self.SCOPE} settings: {', '.join(self.names())}")
            parsed[setting.name] = setting.parse(raw)
        return dataclasses.replace(self, **parsed)

    def __getitem__(self, name: str) -> Any:
        return getattr(self, lookup(name).name)

    def values(self) -> dict[str, Any]:
        """The settings as a dict (names as in the registry)."""
        return {name: getattr(self, name) for name in self.names()}


@dataclass(frozen=True)
class GraphConfig(_Config):
    """What shapes a compiled graph; its resolved values enter the cache fingerprint."""

    SCOPE = GRAPH
    inference_precision: str = _default("inference_precision")
    kv_cache_precision: str = _default("kv_cache_precision")
    attention: str = _default("attention")
    stateful: bool = _default("stateful")
    kquant_requant: str = _default("kquant_requant")
    q4_storage: str = _default("q4_storage")
    zero_points: str = _default("zero_points")
    activations: str = _default("activations")

    @classmethod
    def coerce(cls, graph: GraphConfig | Settings | Mapping[str, Any]) -> GraphConfig:
        """A GraphConfig as it is, a Settings' graph values, or a mapping of graph values."""
        if isinstance(graph, GraphConfig):
            return graph
        if isinstance(graph, Settings):
            return cls.of(graph)
        if not isinstance(graph, Mapping):  # None no longer means "resolve from the environment"
            raise TypeError(f"graph settings: a GraphConfig, Settings or mapping, not {graph!r}")
        return cls.from_values(graph)


@dataclass(frozen=True)
class WorkerConfig(_Config):
    """A worker process's (and an Engine's) settings; ``graph``: its graph's."""

    SCOPE = WORKER
    device: str = _default("device")
    broker: str = _default("broker")
    cache_dir: str = _default("cache_dir")
    cache_only: bool = _default("cache_only")
    source_identity: str = _default("source_identity")
    slots: int = _default("slots")
    cache_lock_timeout_s: float = _default("cache_lock_timeout_s")
    max_prompt_tokens: int = _default("max_prompt_tokens")
    max_new_tokens: int = _default("max_new_tokens")
    curve_secret_key: str = _default("curve_secret_key")
    curve_server_key: str = _default("curve_server_key")
    prefill_chunk: int = _default("prefill_chunk")
    warm_up: str = _default("warm_up")
    batching: str = _default("batching")
    decode_graph: str = _default("decode_graph")
    decode_threads: int = _default("decode_threads")
    kv_cache_mb: int = _default("kv_cache_mb")
    prefix_cache: str = _default("prefix_cache")
    answer_copies: bool = _default("answer_copies")
    answer_tails: bool = _default("answer_tails")
    follow_up_ms: int = _default("follow_up_ms")
    prompt_lookup: str = _default("prompt_lookup")
    prompt_lookup_tokens: int = _default("prompt_lookup_tokens")
    kv_tier: bool = _default("kv_tier")
    kv_events_endpoint: str = _default("kv_events_endpoint")
    kv_tier_mb: int = _default("kv_tier_mb")
    kv_ram_mb: int = _default("kv_ram_mb")
    cache_max_mb: int = _default("cache_max_mb")
    graph: GraphConfig = field(default_factory=GraphConfig)

    @classmethod
    def of(cls, settings: Settings) -> WorkerConfig:
        return dataclasses.replace(super().of(settings), graph=GraphConfig.of(settings))

    def replace(self, **changes: Any) -> WorkerConfig:
        """A copy with ``changes``; graph settings among them go to ``graph``."""
        graph = {k: v for k, v in changes.items() if lookup(k).graph}
        rest = {k: v for k, v in changes.items() if k not in graph}
        return dataclasses.replace(super().replace(**rest), graph=self.graph.replace(**graph))

    def with_graph(self, **changes: Any) -> WorkerConfig:
        """A copy whose graph config has ``changes``."""
        return dataclasses.replace(self, graph=self.graph.replace(**changes))


@dataclass(frozen=True)
class BrokerConfig(_Config):
    """The broker's settings."""

    SCOPE = BROKER
    metrics_port: int = _default("metrics_port")
    queue_limit: int = _default("queue_limit")
    stream_stall_s: float = _default("stream_stall_s")
    progress_timeout_s: float = _default("progress_timeout_s")
    routing: str = _default("routing")
    max_new_tokens: int = _default("max_new_tokens")
    curve_secret_key: str = _default("curve_secret_key")
    curve_allowed_keys: str = _default("curve_allowed_keys")
    curve_worker_keys: str = _default("curve_worker_keys")


@dataclass(frozen=True)
class ClientConfig(_Config):
    """A client's settings (``ovpool.Client``, ``AsyncClient``, the HTTP API's client)."""

    SCOPE = CLIENT
    broker: str = _default("broker")
    connect_timeout_s: float = _default("connect_timeout_s")
    curve_secret_key: str = _default("curve_secret_key")
    curve_server_key: str = _default("curve_server_key")

    @classmethod
    def coerce(cls, settings: ClientConfig | Settings | Mapping[str, Any] | None) -> ClientConfig:
        """What ``Client(settings=...)`` accepts: a ClientConfig, a Settings, or flags to resolve
        (with the environment: the client's constructor is its process's top) or None."""
        if isinstance(settings, ClientConfig):
            return settings
        return cls.of(settings if isinstance(settings, Settings) else Settings.resolve(settings))


@dataclass(frozen=True)
class ApiConfig(_Config):
    """The HTTP API's settings; ``client``: those of its client of the broker."""

    SCOPE = API
    broker: str = _default("broker")
    max_new_tokens: int = _default("max_new_tokens")
    shutdown_timeout_s: float = _default("shutdown_timeout_s")
    max_connections: int = _default("max_connections")
    client: ClientConfig = field(default_factory=ClientConfig)

    @classmethod
    def of(cls, settings: Settings) -> ApiConfig:
        return dataclasses.replace(super().of(settings), client=ClientConfig.of(settings))


CONFIGS: dict[str, type[_Config]] = {c.SCOPE: c for c in (GraphConfig, WorkerConfig, BrokerConfig,
                                                           ClientConfig, ApiConfig)}
