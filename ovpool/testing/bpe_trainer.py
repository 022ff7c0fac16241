"""A tiny byte-level BPE trainer over a small built-in multilingual corpus, for test fixtures.

It yields a real GPT-2 style vocabulary (256 byte tokens + learned merges), so tokenizer and engine
tests exercise true BPE behaviour without shipping or downloading a vocabulary.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

import regex

from ovpool.worker.text.bpe import PreTokenizer, bytes_to_unicode, to_byte_chars

CORPUS = """\
The quick brown fox jumps over the lazy dog. The capital of France is Paris.
Once upon a time there was a little model that wanted to serve tokens quickly.
It's a test; we're testing what they'll say and what I'd do. You've seen it.
def main(argv: list[str]) -> int:
    for i in range(10):
        print(f"value {i} = {i * 2}")
    return 0
if __name__ == "__main__":
    main([])
The numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.14159 42 and 1,234,567.
Der schnelle braune Fuchs springt über den faulen Hund. Grüße aus München!
Le renard brun rapide saute par-dessus le chien paresseux. Ça va très bien, merci.
El rápido zorro marrón salta sobre el perro perezoso. ¿Dónde está la biblioteca?
Быстрая коричневая лиса прыгает через ленивую собаку. Привет, мир!
敏捷的棕色狐狸跳过了懒狗。你好，世界！今天天气很好。
素早い茶色の狐が怠惰な犬を飛び越える。こんにちは世界。
빠른 갈색 여우가 게으른 개를 뛰어넘는다. 안녕하세요.
الثعلب البني السريع يقفز فوق الكلب الكسول. مرحبا بالعالم.
Emoji: 😀 🎉 👍🏽 🚀 ❤️ and more emoji 😀😀 🎉.
Tabs\tand  multiple   spaces    and
newlines

in text. <html><body class="main">Hello</body></html> {"key": [1, 2, 3]}
"""


@lru_cache(maxsize=4)
def train(n_merges: int = 300, corpus: str = CORPUS) -> tuple[list[str], list[str]]:
    """Byte-level BPE: (tokens, merges), the 256 byte tokens then the merged ones, in rank order."""
    words = Counter(to_byte_chars(w) for w in PreTokenizer("gpt2").split(corpus))
    base = list(bytes_to_unicode().values())
    merged, merges = learn_merges(words, n_merges, set(base))
    return base + merged, [f"{a} {b}" for a, b in merges]


@lru_cache(maxsize=4)
def train_sentencepiece(n_merges: int = 300, corpus: str = CORPUS) -> tuple[list[str], list[str]]:
    """SentencePiece-style BPE (spaces as '▁' starting each word): (characters, merged pieces in
    rank order). A SentencePiece BPE model scores its pieces by rank, so merging by score is BPE."""
    words = Counter(regex.findall(r"\u2581*[^\u2581]+|\u2581+", corpus.replace(" ", "\u2581")))
    chars = sorted({c for w in words for c in w})
    merged, _ = learn_merges(words, n_merges, set(chars))
    return chars, merged


def learn_merges(words: Counter, n_merges: int, known: set[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """(new tokens, merges): the most frequent adjacent pair, merged ``n_merges`` times."""
    splits = {w: list(w) for w in words}
    tokens: list[str] = []
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        pair = _most_frequent_pair(words, splits)
        if pair is None:
            break
        merges.append(pair)
        if pair[0] + pair[1] not in known:  # ("ab","c") and ("a","bc") both give "abc"
            known.add(pair[0] + pair[1])
            tokens.append(pair[0] + pair[1])
        for parts in splits.values():
            _apply(parts, pair)
    return tokens, merges


def _most_frequent_pair(words: Counter, splits: dict[str, list[str]]) -> tuple[str, str] | None:
    counts: Counter = Counter()
    for word, freq in words.items():
        parts = splits[word]
        for pair in zip(parts, parts[1:], strict=False):
            counts[pair] += freq
    if not counts:
        return None
    # Ties broken by the pair itself, so training is deterministic.
    return min(counts, key=lambda p: (-counts[p], p))


def _apply(parts: list[str], pair: tuple[str, str]) -> None:
    i = 0
    while i < len(parts) - 1:
        if parts[i] == pair[0] and parts[i + 1] == pair[1]:
            parts[i:i + 2] = [pair[0] + pair[1]]
        i += 1
