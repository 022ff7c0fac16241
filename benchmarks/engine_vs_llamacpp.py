"""ovpool's Engine against llama.cpp (llama-cpp-python) on the same GGUF, in the same run: load,
TTFT of a 512-token prompt, decode tokens/s, peak RSS. GenAI cannot read gemma3 GGUFs, so
llama.cpp is the peer for gemma3-270m. The method is benchmarks/engine_vs_genai.py's (fresh
subprocesses for load and RSS, alternating paired rounds for TTFT and decode).

    .venv/bin/pip install llama-cpp-python   # builds llama.cpp from source (~10 min on 2 cores)
    .venv/bin/python benchmarks/engine_vs_llamacpp.py [--model gemma3-270m] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from engine_vs_genai import main  # noqa: E402

if __name__ == "__main__":
    main(peer="llamacpp", model="gemma3-270m")
