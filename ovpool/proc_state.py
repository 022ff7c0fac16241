"""A local process's state as Linux's /proc tells it: whether it is stopped, and who is in its
process group. Read by waits that must not outlast a process that will never answer (a cache
lock's holder, a benchmark's children); elsewhere /proc is absent and nothing is ever stopped."""

from __future__ import annotations

from pathlib import Path


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), None if unreadable."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    _, _, fields = text.rpartition(")")  # the name in parentheses may hold spaces and ')'
    return fields.split() or None


def stopped(pid: int) -> bool:
    """Stopped by a signal (SIGSTOP, SIGTSTP) or a debugger: it runs no code until SIGCONT."""
    fields = _stat(pid)
    return fields is not None and fields[0] in ("T", "t")


def group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (zombies left out), in pid order."""
    members = []
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat(entry.name)
        if fields is not None and len(fields) > 3 and fields[3] == str(pgid) and fields[0] != "Z":
            members.append(int(entry.name))
    return sorted(members)


def command(pid: int) -> str:
    """Its command line, as far as it can still be read."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip() or "?"
