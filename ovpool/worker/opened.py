"""GGUF headers and tokenizers read before their worker starts.

A worker's start parses its model's GGUF header and builds the tokenizer on its main thread
(for a vocabulary as large as gemma3-270m's, a share of a swap: docs/performance.md, Model swaps),
and a warm swap waits for it: the blob's import, on another thread, is often done first. ``ovpool
serve``'s spare process (serve/spare.py) reads those of the models it may become while the pool
is idle, and the worker it becomes takes its own (``OpenedModels.take``). The file's identity
(device, inode, size, modification time) is taken around the read and checked again when taken:
a model file replaced meanwhile is read again by the engine, never served from the old header.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ovpool.models import resolve_model_path
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

Identity = tuple[int, int, int, int]


def _identity(path: Path) -> Identity:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


@dataclass(frozen=True)
class OpenedModel:
    model: GGUFModel
    tokenizer: Tokenizer
    identity: Identity  # of the file when it was read

    @classmethod
    def read(cls, source: str | Path) -> OpenedModel | None:
        """``source`` (a path or alias) read; None if its file changed during the read."""
        before = _identity(resolve_model_path(source))
        model = GGUFModel.open(source)
        opened = cls(model, Tokenizer.from_metadata(model.metadata), before)
        return opened if opened.current() else None

    def current(self) -> bool:
        """Whether the file is still the one that was read."""
        try:
            return _identity(self.model.path) == self.identity
        except OSError:
            return False


class OpenedModels:
    """Models read ahead, by the source a worker's ``--model`` names them with."""

    def __init__(self, opened: dict[str, OpenedModel] | None = None):
        self._opened = dict(opened or {})

    @classmethod
    def read(cls, sources: Iterable[str]) -> OpenedModels:
        """Each of ``sources`` that reads; one that does not is left to its worker's own open,
        which reports why."""
        opened = {}
        for source in sources:
            try:
                found = OpenedModel.read(source)
            except Exception:  # advice only (the worker's own open reports it): the spare lives on
                continue
            if found is not None:
                opened[source] = found
        return cls(opened)

    def sources(self) -> list[str]:
        return sorted(self._opened)

    def take(self, source: str) -> OpenedModel | None:
        """``source``'s, if its file is unchanged; the others are let go (a worker runs one)."""
        found = self._opened.pop(source, None)
        self._opened.clear()
        if found is None or not found.current():
            return None
        log.info("model %s: GGUF header and tokenizer read ahead", source)
        return found
