"""llama.cpp's OpenVINO backend (ggml-openvino, the system ../shared/spec/compiled-model-cache.md
describes) as a benchmark peer, driven through its own binaries on OpenVINO's CPU device.

    bash ../shared/tools/build-llamacpp-openvino.sh /tmp/llamacpp-ov    # from the project root, ~17 min
    .venv/bin/python benchmarks/llamacpp_openvino.py --model smollm2 [--prompt-tokens 256]
        [--new-tokens 48] [--repetitions 3] [--json]                      # its llama-bench alone

The binaries are looked for in ``$OVPOOL_LLAMACPP_OPENVINO/bin`` (default /tmp/llamacpp-ov/bin);
where they are missing, the side stops with the build command. Every layer is offloaded to the
backend (``-ngl 99``) with ``GGML_OPENVINO_DEVICE=CPU`` and as many threads as cores; the backend's
other switches stay at their defaults: stateless execution (``stateful``: its KV cache as the
compiled model's state instead), no compiled-model cache, and an empty
compile configuration, so OpenVINO's CPU defaults decide its numerics (on AMX: bf16 inference
precision, int8 dynamic activations in groups of 32).

``Server`` is ``llama-server`` with one slot, timed per streamed token the way the other peers are
(benchmarks/scale_peers.py); its CPU seconds and peak RSS (VmHWM) are the server process's.
``bench`` is ``llama-bench``: prompt and generation tokens/s (its generation starts from an empty
context), peak RSS and CPU seconds of the process (GNU time).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llamacpp_server import ServerProcess

from ovpool.demo import free_port

DIR_ENV = "OVPOOL_LLAMACPP_OPENVINO"
DEFAULT_DIR = "/tmp/llamacpp-ov"
_LINE_LIMIT = 1 << 20  # one streamed event; a longer one is an error, not a memory sink


def binary(name: str) -> Path:
    """The built ``name`` (llama-server, llama-bench), or a stop that says how to build it."""
    folder = Path(os.environ.get(DIR_ENV) or DEFAULT_DIR)
    path = folder / "bin" / name
    if not os.access(path, os.X_OK):
        raise SystemExit(f"llama.cpp's OpenVINO backend is not built ({path} missing): run "
                         f"`bash ../shared/tools/build-llamacpp-openvino.sh {folder}` from the project "
                         f"root (~17 min on 2 cores), or set {DIR_ENV} to its build folder")
    return path


def environment(stateful: bool) -> dict[str, str]:
    """OpenVINO's CPU device; ``stateful``: the KV cache as the compiled model's state
    (GGML_OPENVINO_STATEFUL_EXECUTION=1) instead of ggml tensors passed in each pass (its default)."""
    return {**os.environ, "GGML_OPENVINO_DEVICE": "CPU",
            "GGML_OPENVINO_STATEFUL_EXECUTION": str(int(stateful))}


def _threads() -> str:
    return str(os.cpu_count() or 1)


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vmhwm_mb(pid: int | str) -> float:
    """Peak RSS (VmHWM, MiB) of process ``pid`` (or ``"self"``)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024


def token_counts(lines, limit: int = _LINE_LIMIT):
    """The generated-token count after each streamed event of llama-server's ``/completion``
    (``data: {json}`` lines), and finally its own total from the last event; raises on an event
    that is not JSON, longer than ``limit``, or an error."""
    for raw in lines:
        if len(raw) > limit:
            raise RuntimeError(f"llama-server sent an event over {limit} bytes")
        if not raw.startswith(b"data: "):
            continue
        try:
            event = json.loads(raw[6:])
        except ValueError as e:
            raise RuntimeError(f"llama-server sent an event that is not JSON: {raw[:200]!r}") from e
        count = event.get("tokens_predicted", 0) if isinstance(event, dict) else None
        if "error" in event or not isinstance(count, int):
            raise RuntimeError(f"llama-server failed or sent no token count: {raw[:300]!r}")
        yield count, bool(event.get("stop"))


class Server(ServerProcess):
    """``llama-server`` on a free port, one slot, a context of ``context`` tokens; output to a file
    in ``workdir``. ``ready_s``: process start to its /health answering 200 (model loaded)."""

    def __init__(self, model: str, context: int, workdir: Path, stateful: bool = False):
        port = free_port()
        argv = [str(binary("llama-server")), "-m", model, "-ngl", "99", "-t", _threads(),
                "-tb", _threads(), "-c", str(context), "-np", "1", "--no-webui",
                "--host", "127.0.0.1", "--port", str(port)]
        super().__init__(argv, port, workdir / "llama-server.log", "/health", environment(stateful))

    def cpu_s(self) -> float:
        return _proc_cpu_s(self.pid)

    def peak_rss_mb(self) -> float:
        return vmhwm_mb(self.pid)

    def run(self, prompt: list[int], n: int) -> tuple[tuple[float, float], list[tuple[float, float]]]:
        """Greedy, ``n`` tokens whatever the end-of-text token, no prompt reuse: (start, each
        token's arrival) as (wall seconds, the server's CPU seconds), as engine_vs_genai's runners."""
        body = json.dumps({"prompt": prompt, "n_predict": n, "ignore_eos": True, "temperature": 0.0,
                           "top_k": 1, "cache_prompt": False, "stream": True})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        stamps: list[tuple[float, float]] = []
        start = (time.perf_counter(), self.cpu_s())
        conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"llama-server answered {response.status}: {response.read(300)!r}")
        lines = iter(lambda: response.readline(_LINE_LIMIT + 1), b"")
        for count, stop in token_counts(lines):
            stamp = (time.perf_counter(), self.cpu_s())
            stamps.extend([stamp] * (count - len(stamps)))
            if stop:
                break
        conn.close()
        return start, stamps


def bench(model: str, prompt_tokens: int, new_tokens: int, repetitions: int, stateful: bool = False) -> dict:
    """llama-bench's prompt and generation tokens/s (mean of ``repetitions``), and the process's
    peak RSS (MiB) and CPU seconds, from GNU time."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as usage:
        argv = ["/usr/bin/time", "-o", usage.name, "-f", "%M %U %S", str(binary("llama-bench")),
                "-m", model, "-ngl", "99", "-t", _threads(), "-p", str(prompt_tokens),
                "-n", str(new_tokens), "-r", str(repetitions), "-o", "json"]
        proc = subprocess.run(argv, capture_output=True, text=True, env=environment(stateful), check=False)
        if proc.returncode != 0:
            raise SystemExit(f"llama-bench failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        rss_kb, user, system = usage.read().split()[-3:]
    return {**bench_rates(proc.stdout, prompt_tokens, new_tokens),
            "peak_rss_mb": int(rss_kb) / 1024, "cpu_s": float(user) + float(system)}


def bench_rates(stdout: str, prompt_tokens: int, new_tokens: int) -> dict:
    """``prefill_tps`` and ``decode_tps`` from llama-bench's ``-o json`` output (a list of tests)."""
    try:
        tests = json.loads(stdout[stdout.index("["):])
        rates = {(t["n_prompt"], t["n_gen"]): float(t["avg_ts"]) for t in tests}
        return {"prefill_tps": rates[(prompt_tokens, 0)], "decode_tps": rates[(0, new_tokens)]}
    except (ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"llama-bench's output has no pp{prompt_tokens} and tg{new_tokens} rates "
                         f"({e!r}):\n{stdout[:500]}") from e


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="GGUF path or alias")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--repetitions", type=int, default=3)
    p.add_argument("--stateful", action="store_true", help="GGML_OPENVINO_STATEFUL_EXECUTION=1")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    from ovpool.models import resolve_model_path

    result = bench(str(resolve_model_path(args.model)), args.prompt_tokens, args.new_tokens, args.repetitions,
                   args.stateful)
    print(json.dumps(result) if args.json else
          f"pp{args.prompt_tokens} {result['prefill_tps']:.1f} tok/s, tg{args.new_tokens} "
          f"{result['decode_tps']:.2f} tok/s, peak RSS {result['peak_rss_mb']:.0f} MiB, "
          f"CPU {result['cpu_s']:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
