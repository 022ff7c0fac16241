"""One setting: its name, type, allowed values, default, scopes, environment variable, and the
parse of a raw value (from a flag or the environment) into it, with an error that names it."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ovpool.errors import InvalidSettingError

# Which processes read a setting: a client (ovpool.Client, the HTTP API's too), the broker, a worker,
# a worker's compiled graph (these enter the cache fingerprint), the HTTP API, any ovpool process.
CLIENT, BROKER, WORKER, GRAPH, API, PROCESS = "client", "broker", "worker", "graph", "api", "process"
SERVE = "serve"  # `ovpool serve` itself: which of its models are loaded
SCOPES = (CLIENT, BROKER, WORKER, GRAPH, API, SERVE, PROCESS)

_TRUE = {"1", "true", "yes", "on"}
_INT64_MAX = 2**63 - 1
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class Setting:
    name: str
    type: type
    default: Any
    help: str
    scopes: tuple[str, ...]  # the processes that read it (SCOPES)
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None  # ints: at most int64's without one (every value may go on the wire)
    default_from_env: Callable[[Mapping[str, str]], Any] | None = None  # a default that depends on env

    def __post_init__(self) -> None:
        unknown = set(self.scopes) - set(SCOPES)
        if not self.scopes or unknown:
            raise ValueError(f"setting {self.name}: scopes {self.scopes} (known: {', '.join(SCOPES)})")

    @property
    def graph(self) -> bool:
        """It changes the compiled graph: its effective value enters the cache fingerprint."""
        return "graph" in self.scopes

    def default_in(self, env: Mapping[str, str]) -> Any:
        return self.default if self.default_from_env is None else self.default_from_env(env)

    @property
    def env(self) -> str:
        return "OVPOOL_" + self.name.upper()

    def parse(self, raw: Any, from_env: bool = False) -> Any:
        """``raw`` (a string from a flag or the environment, or a Python value) as this type; an
        error names the setting, or the environment variable that set it (``from_env``)."""
        try:
            value = self._convert(raw)
        except ValueError as exc:
            raise self._invalid(raw, f"is not {self._expected()}", from_env) from exc
        if self.choices is not None and value not in self.choices:
            raise self._invalid(raw, f"is not allowed{self._allowed()}", from_env)
        if isinstance(value, float) and math.isnan(value):  # it compares false with every bound
            raise self._invalid(raw, f"is not {self._expected()}", from_env)
        if self.minimum is not None and value < self.minimum:
            raise self._invalid(raw, f"is below the minimum {self.minimum:g}", from_env)
        if (most := self._most()) is not None and value > most:
            raise self._invalid(raw, f"is above the maximum {most:g}" if isinstance(most, float)
                                else f"is above the maximum {most}", from_env)
        return value

    def _most(self) -> float | None:
        return self.maximum if self.maximum is not None or self.type is not int else _INT64_MAX

    def _invalid(self, raw: Any, problem: str, from_env: bool) -> InvalidSettingError:
        if from_env:
            return InvalidSettingError(f"environment variable {self.env}={raw!r} (setting {self.name}) "
                                       f"{problem}; fix or unset {self.env}")
        return InvalidSettingError(f"setting {self.name}: {raw!r} {problem}")

    def _expected(self) -> str:
        kind = {int: "a whole number", float: "a number"}.get(self.type)
        if kind is None:
            return f"a valid {self.type.__name__}{self._allowed()}"
        at_least = f" >= {self.minimum:g}" if self.minimum is not None else ""
        return f"a valid {self.type.__name__} ({kind}{at_least})"

    def _convert(self, raw: Any) -> Any:
        if self.type is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError(raw)
        if isinstance(raw, str):
            raw = raw.strip()
        return self.type(raw)

    def _allowed(self) -> str:
        if self.choices is not None:
            return f"; allowed values: {', '.join(self.choices)}"
        if self.type is bool:
            return "; use on/off, true/false or 1/0"
        return ""
