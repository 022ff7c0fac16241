"""``make demo``: the main job on a fresh machine, end to end, in about a minute.

Starts ``ovpool serve`` with the default model on CPU, waits until its worker is ready, streams one
prompt to the terminal, asks one chat question, shows ``ovpool status`` and ``ovpool cache ls``, and
stops everything. The first run compiles the model and writes it to the cache
(``model cache WROTE``); a second run imports it (``model cache HIT``) and is ready much sooner.
Serve runs closed (its own CURVE keys): the demo's client takes the key files its state file names.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ovpool.cli.common import timings_text
from ovpool.errors import OvpoolError
from ovpool.serve.child import terminate
from ovpool.serve.spec import DEFAULT_MODEL
from ovpool.settings import REGISTRY, Settings, child_environment

READY_TIMEOUT_S = 600
_CACHE_LINE = re.compile(r"model cache (HIT|WROTE|MISS)\b.*")


def say(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def ovpool(*args: str, env: dict[str, str] | None = None) -> None:
    """Run an ovpool command the way a user would, showing the command line."""
    print(f"$ ovpool {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "ovpool", *args], check=True,
                   env=child_environment(env))


def client_keys(workdir: Path) -> dict[str, str]:
    """The pool's client key files, which serve's state file names (serve runs closed)."""
    return json.loads((workdir / "serve.json").read_text())["client_keys"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(workdir: Path, endpoint: str, http: str) -> Iterator[subprocess.Popen]:
    """`ovpool serve` in the background, its log in ``workdir``; SIGTERM on the way out."""
    args = ["--bind", endpoint, "--http", http]
    argv = [sys.executable, "-m", "ovpool", "serve", *args, "--state-file", str(workdir / "serve.json")]
    print(f"$ ovpool serve {' '.join(args)}   (log: {workdir / 'serve.log'})", flush=True)
    with open(workdir / "serve.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        stop(proc)


def wait_ready(proc: subprocess.Popen, workdir: Path) -> float:
    """Seconds until serve's worker is ready; the model's cache outcome is printed on the way."""
    started, state_file = time.monotonic(), workdir / "serve.json"
    while time.monotonic() - started < READY_TIMEOUT_S:
        if proc.poll() is not None:
            raise SystemExit(f"ovpool serve exited with status {proc.returncode}:\n"
                             f"{(workdir / 'serve.log').read_text()[-3000:]}")
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            workers = json.loads(state_file.read_text())["workers"]
            if workers and all(w["state"] == "ready" for w in workers):
                return time.monotonic() - started
            failing = [w for w in workers if w["state"] == "failing"]
            if failing:
                raise SystemExit(f"worker failing: {failing[0]['reason']}")
        time.sleep(0.2)
    raise SystemExit(f"no worker ready after {READY_TIMEOUT_S} s; see {workdir / 'serve.log'}")


def report_load(log: Path, seconds: float) -> None:
    """How the worker got its compiled model(s), from its `model cache ...` log lines."""
    outcomes = [m.group(0) for m in _CACHE_LINE.finditer(log.read_text())]
    print(f"worker ready {seconds:.1f} s after start")
    for line in outcomes:
        print(f"  {line}")
    if outcomes and all(o.startswith("model cache HIT") for o in outcomes):
        print("-> imported from the cache: no graph build, no compile")
    else:
        print("-> compiled and exported to the cache; run `make demo` again to see it imported (HIT)")


def stop(proc: subprocess.Popen) -> None:
    terminate(proc, grace_s=30)


def ask(endpoint: str, keys: dict[str, str]) -> None:
    from ovpool.client import Client

    with Client(endpoint, model=DEFAULT_MODEL, settings=keys) as client:
        say("streamed completion: 'The three primary colors are'")
        for delta in client.stream("The three primary colors are", max_tokens=40):
            print(delta.text, end="", flush=True)
        print()
        say("chat: 'What is the capital of France? Answer in one sentence.'")
        answer = client.chat([{"role": "user", "content": "What is the capital of France? "
                               "Answer in one sentence."}], max_tokens=40)
        print(answer.text.strip())
        print(f"({answer.usage.completion_tokens} tokens; {timings_text(answer.timings)})")


def main() -> None:
    try:
        run()
    except (OvpoolError, subprocess.CalledProcessError) as exc:  # one line, not a traceback
        raise SystemExit(f"demo failed: {exc}") from None


def run() -> None:
    # Free ports, not the defaults: another ovpool serve (or anything on 8000) must not break it.
    endpoint, http = f"tcp://127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    cache = Settings.resolve().cache_dir
    with tempfile.TemporaryDirectory(prefix="ovpool-demo-") as tmp:
        workdir = Path(tmp)
        say(f"starting ovpool serve: model {DEFAULT_MODEL} on CPU, cache {cache}")
        with serving(workdir, endpoint, http) as proc:
            seconds = wait_ready(proc, workdir)
            report_load(workdir / "serve.log", seconds)
            keys = client_keys(workdir)
            ask(endpoint, keys)
            say("pool status")
            ovpool("status", "--broker", endpoint,
                   env={REGISTRY[name].env: value for name, value in keys.items()})
            say("compiled-model cache")
            ovpool("cache", "ls", "--cache-dir", str(cache))
            say("stopping (SIGTERM to ovpool serve)")
        print(f"ovpool serve exited with status {proc.returncode}")


if __name__ == "__main__":
    main()
