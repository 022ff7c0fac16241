"""llama.cpp's on-demand model swap, as a benchmark peer: llama-cpp-python's OpenAI server with
several models in one config file (``python -m llama_cpp.server --config_file``), which holds one
model at a time and, when a request names another, closes the loaded one and loads the requested
GGUF in that request (its ``LlamaProxy``).

    with LlamaCppServer({"smollm2": path1, "gemma3-270m": path2}, workdir) as server:
        server.first_token_s("gemma3-270m")   # the swap: request -> first streamed token

Settings chosen for a fair swap beside ovpool's: every core for prompt and decode (the server's
default takes half for decode), ``logits_all`` off (ovpool computes the last position's logits
only; the server's default keeps every position's), its default context of 2,048 tokens. On a CPU
with AMX, llama.cpp's weight repacking ("extra buffer types") is turned off: its AMX matmul
segfaults at the first pass there (llama-cpp-python 0.3.36, both models; ggml-org/llama.cpp#20824),
so its load skips the repack, which if anything shortens its swap.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ovpool.demo import free_port
from ovpool.serve.child import terminate

# Runs the server (argv: this folder, then the server's arguments), on AMX without extra buffer
# types, as engine_vs_genai.py loads llama.cpp.
_BOOT = """
import runpy, sys
sys.path.insert(0, sys.argv[1])
from engine_vs_genai import llamacpp_without_amx_repack
llamacpp_without_amx_repack()
sys.argv = ["llama_cpp.server", *sys.argv[2:]]
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
"""


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


class ServerProcess:
    """An HTTP server's process on 127.0.0.1:``port``, output to ``log_path``, ready once GET
    ``ready_path`` answers 200; ``ready_s``: its start to then. Stopped on exit (SIGTERM, then
    SIGKILL after 30 s)."""

    def __init__(self, argv: list[str], port: int, log_path: Path, ready_path: str,
                 env: dict[str, str] | None = None):
        self.port, self.log_path, self.ready_s = port, log_path, 0.0
        self._argv, self._ready_path, self._env = argv, ready_path, env
        self._proc: subprocess.Popen | None = None

    def __enter__(self):
        started = time.perf_counter()
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(self._argv, stdout=log, stderr=subprocess.STDOUT, env=self._env)
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__()
            raise
        self.ready_s = time.perf_counter() - started
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            terminate(self._proc, 30)
            self._proc = None

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _wait_ready(self, timeout_s: float = 600.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{Path(self._argv[0]).name} did not start (exit "
                                   f"{self._proc.returncode}; {self.log_path}):\n{tail}")
            time.sleep(0.1)

    def _answers(self) -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            conn.request("GET", self._ready_path)
            return conn.getresponse().status == 200
        except OSError:
            return False


class LlamaCppServer(ServerProcess):
    """The server's process, started on a free port with ``models`` (alias -> GGUF path); its
    first model is loaded at start. Output goes to ``workdir/llamacpp.log``."""

    def __init__(self, models: dict[str, str], workdir: Path, threads: int | None = None):
        threads = threads or os.cpu_count() or 1
        port = free_port()
        entries = [{"model": str(path), "model_alias": alias, "n_threads": threads,
                    "n_threads_batch": threads, "logits_all": False, "verbose": False}
                   for alias, path in models.items()]
        config = workdir / "llamacpp.json"
        config.write_text(json.dumps({"host": "127.0.0.1", "port": port, "models": entries}))
        argv = [sys.executable, "-c", _BOOT, str(Path(__file__).parent), "--config_file", str(config)]
        super().__init__(argv, port, workdir / "llamacpp.log", "/v1/models")

    def first_token_s(self, model: str, prompt: str = "The capital of France is",
                      max_tokens: int = 4) -> float:
        """Seconds from sending a streamed completion for ``model`` to its first token's event
        (the stream is then read to its end)."""
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        started = time.perf_counter()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"llama_cpp.server answered {response.status}: {response.read()[:300]!r}")
        elapsed = None
        for line in response:
            if elapsed is None and line.startswith(b"data: {"):
                elapsed = time.perf_counter() - started
        conn.close()
        if elapsed is None:
            raise RuntimeError(f"llama_cpp.server streamed no token for {model}")
        return elapsed
