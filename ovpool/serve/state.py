"""Serve's published view as a file, and the health probe that reads it (Kubernetes exec probes).

The file is replaced atomically (temp file + rename), so a reader never sees half a view. Serve
rewrites it every half heartbeat interval, so its age says whether serve's loop is alive.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path

from ovpool import json_files, timing
from ovpool.errors import ConfigError

# A view older than this means serve's loop is stuck or gone.
STALE_AFTER_S = timing.HEARTBEAT_EXPIRY_S * 5


def write_state(path: str | Path, view: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(view, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def check(view: dict | None, *, need_ready: bool, now: float | None = None) -> tuple[bool, str]:
    """(healthy, one line why) for a view read from the state file (None: no file)."""
    if view is None:
        return False, "no state file yet: serve has not started"
    age = (now if now is not None else time.time()) - view.get("updated", 0)
    if age > STALE_AFTER_S:
        return False, f"state is {age:.0f} s old: serve's loop is not running"
    states = [w["state"] for w in view.get("workers", [])]
    summary = ", ".join(f"{states.count(s)} {s}" for s in sorted(set(states))) or "no workers"
    if need_ready and "ready" not in states:
        return False, f"no worker ready ({summary})"
    if need_ready and view.get("draining"):  # load balancers stop sending while it drains
        return False, f"draining ({summary})"
    return True, summary


def read_state(path: str | Path) -> dict | None:
    """Serve's view from ``path``, None if there is none yet; ConfigError naming the file if it
    cannot be read or is not a view serve writes (the probe and `ovpool restart` read it)."""
    try:
        view = json_files.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise ConfigError(f"state file {path} cannot be read: {getattr(exc, 'strerror', None) or exc}; "
                          "is it the one `ovpool serve --state-file` writes?") from None
    if not _is_view(view):
        raise ConfigError(f"state file {path} is not a view `ovpool serve --state-file` writes (it needs"
                          " a number 'updated' and a list 'workers' of objects with a text 'state')")
    return view


def _is_view(view: object) -> bool:
    return (isinstance(view, dict) and type(view.get("updated")) in (int, float)
            and math.isfinite(view["updated"])  # an 'updated' of 1e999 would be fresh for ever
            and isinstance(view.get("workers"), list)
            and all(isinstance(w, dict) and isinstance(w.get("state"), str) for w in view["workers"]))
