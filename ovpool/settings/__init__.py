"""One registry of every ovpool setting.

Each setting has a name, a type, its allowed values, a default, an environment variable
(``OVPOOL_<NAME>``) and a command-line form (``--set NAME=VALUE``). Settings marked ``graph``
change the compiled graph, so their effective values enter the cache fingerprint.

The package: ``setting`` (one setting and the parse of its values), ``registry`` (every setting,
one table), ``resolved`` (``Settings``: the values one process resolved), ``variables`` (the
environment variables that are not settings). Import them all from here.

Resolution order: flag > environment > default; every resolved value remembers its source. A
default may depend on the environment: ``cache_dir`` is ``$XDG_CACHE_HOME/ovpool`` (else
``~/.cache/ovpool``) for every command and for ``Engine``; an empty ``cache_dir`` turns caching off.
"""

from ovpool.settings.registry import REGISTRY, default_cache_dir
from ovpool.settings.resolved import Settings, lookup, parse_assignments
from ovpool.settings.setting import API, BROKER, CLIENT, GRAPH, PROCESS, SCOPES, SERVE, WORKER, Setting
from ovpool.settings.variables import (
    VARIABLES,
    Variable,
    child_environment,
    heartbeat_interval_s,
    set_variable,
    variable,
)

__all__ = [
    "API", "BROKER", "CLIENT", "GRAPH", "PROCESS", "REGISTRY", "SCOPES", "SERVE", "VARIABLES", "WORKER",
    "Setting", "Settings", "Variable", "child_environment", "default_cache_dir", "heartbeat_interval_s",
    "lookup", "parse_assignments", "set_variable", "variable",
]
