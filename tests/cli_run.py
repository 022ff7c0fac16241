"""Running ``ovpool`` as a user does: a separate process, its own environment, stdin and terminal width."""

from __future__ import annotations

import os
import subprocess
import sys


def ovpool(*args: str, env: dict[str, str] | None = None, stdin: str | None = None,
           timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m ovpool ARGS`` with ``env`` over this environment (a None value unsets it)."""
    merged = {**os.environ, **(env or {})}
    merged = {k: v for k, v in merged.items() if v is not None}
    return subprocess.run([sys.executable, "-m", "ovpool", *args], capture_output=True, text=True,
                          env=merged, input=stdin if stdin is not None else "", timeout=timeout)


def clean_error(result: subprocess.CompletedProcess, *needles: str) -> str:
    """Assert ``result`` failed with one clear message (no traceback) holding every needle."""
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not in: {result.stderr}"
    return result.stderr
