"""What serve's workers hold, measured rather than guessed: each process's PSS.

PSS (proportional set size, /proc/PID/smaps_rollup) counts a page shared by N processes as 1/N
in each, so the PSS of a pool's workers adds up to the memory they take together: the libraries
and a cached blob's clean pages, which several workers map, are counted once. RSS would count
them in every worker. Read twice a heartbeat, not every round: the kernel walks the process's
page tables to answer (a few ms for a worker of ~500 MiB).
"""

from __future__ import annotations

from pathlib import Path

from ovpool import timing


def pss_bytes(pid: int, proc: Path = Path("/proc")) -> int | None:
    """``pid``'s PSS in bytes; None if it is gone or the kernel does not say (no smaps_rollup)."""
    try:
        text = (proc / str(pid) / "smaps_rollup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return None


class MemoryReader:
    """``read(now, pids)``: bytes per worker name, or None between two readings."""

    def __init__(self, interval_s: float = timing.HEARTBEAT_INTERVAL_S / 2, proc: Path = Path("/proc")):
        self.interval_s, self._proc = interval_s, proc
        self._next = 0.0

    def read(self, now: float, pids: dict[str, int]) -> dict[str, int] | None:
        if now < self._next:
            return None
        self._next = now + self.interval_s
        found = {name: pss_bytes(pid, self._proc) for name, pid in pids.items()}
        return {name: used for name, used in found.items() if used is not None}
