"""Settings resolved for one process: flag > environment > default, each value with its source."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from ovpool.errors import InvalidSettingError, UnknownSettingError
from ovpool.settings.registry import REGISTRY
from ovpool.settings.setting import Setting


def lookup(name: str) -> Setting:
    key = name.strip().lower().replace("-", "_")
    if key not in REGISTRY:
        raise UnknownSettingError(f"unknown setting {name!r}; valid names: {', '.join(REGISTRY)}")
    return REGISTRY[key]


def parse_assignments(items: Iterable[str]) -> dict[str, str]:
    """``["NAME=VALUE", ...]`` from ``--set`` flags as a dict; a malformed item is an error."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise InvalidSettingError(f"--set {item!r}: expected NAME=VALUE, e.g. --set stateful=off")
        out[lookup(name).name] = value
    return out


class Settings:
    """Resolved values of every setting, each with its source (``flag``, ``env`` or ``default``)."""

    def __init__(self, values: Mapping[str, Any], sources: Mapping[str, str],
                 defaults: Mapping[str, Any] | None = None):
        self._values = dict(values)
        self._sources = dict(sources)
        self._defaults = dict(defaults or {})  # defaults that depend on the environment, as resolved

    @classmethod
    def resolve(cls, flags: Mapping[str, Any] | None = None,
                env: Mapping[str, str] | None = None) -> Settings:
        flags = {lookup(k).name: v for k, v in (flags or {}).items() if v is not None}
        env = os.environ if env is None else env
        values, sources = {}, {}
        defaults = {s.name: s.default_in(env) for s in REGISTRY.values() if s.default_from_env}
        for s in REGISTRY.values():
            if s.name in flags:
                values[s.name], sources[s.name] = s.parse(flags[s.name]), "flag"
            elif s.env in env:
                values[s.name], sources[s.name] = s.parse(env[s.env], from_env=True), "env"
            else:
                values[s.name], sources[s.name] = defaults.get(s.name, s.default), "default"
        return cls(values, sources, defaults)

    @classmethod
    def coerce(cls, settings: Settings | Mapping[str, Any] | None) -> Settings:
        """What an API that takes ``settings=`` accepts: a Settings, a dict of flags, or None."""
        return settings if isinstance(settings, Settings) else cls.resolve(settings)

    def __getitem__(self, name: str) -> Any:
        return self._values[lookup(name).name]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except UnknownSettingError as exc:
            raise AttributeError(name) from exc

    def source(self, name: str) -> str:
        return self._sources[lookup(name).name]

    def replace(self, **flags: Any) -> Settings:
        """A copy with ``flags`` applied as flag-sourced values."""
        values, sources = dict(self._values), dict(self._sources)
        for name, raw in flags.items():
            s = lookup(name)
            values[s.name], sources[s.name] = s.parse(raw), "flag"
        return Settings(values, sources, self._defaults)

    def graph_values(self) -> dict[str, Any]:
        """Effective graph-changing values: an explicit default equals unset here."""
        return {s.name: self._values[s.name] for s in REGISTRY.values() if s.graph}

    def rows(self) -> list[dict[str, Any]]:
        return [
            {"name": s.name, "value": self._values[s.name], "source": self._sources[s.name],
             "default": self._defaults.get(s.name, s.default), "type": s.type.__name__,
             "choices": list(s.choices or []),
             "env": s.env, "graph": s.graph, "scopes": list(s.scopes), "help": s.help}
            for s in REGISTRY.values()
        ]
