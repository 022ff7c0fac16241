"""Byte-level BPE (GPT-2 style): the byte alphabet, pre-tokenizer regexes, and rank-ordered merges.

The pre-tokenizer follows llama.cpp (llama-vocab.cpp): ``tokenizer.ggml.pre`` selects a list of
regexes applied in sequence, each one splitting every fragment left by the previous one into its
matches and the gaps between them.
"""

from __future__ import annotations

import heapq
from functools import lru_cache

import regex

from ovpool.errors import UnsupportedModelError

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")

_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")

# tokenizer.ggml.pre -> regexes, as llama.cpp groups them.
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    "default": _DEFAULT,
    "gpt2": (_GPT2,),
    "gpt-2": (_GPT2,),
    "llama-bpe": (_LLAMA3,),
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "deepseek-r1-qwen": (_QWEN2,),
    "smollm": (r"\p{N}", _GPT2),
    "starcoder": (r"\p{N}", _GPT2),
    "refact": (r"\p{N}", _GPT2),
}


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (spaces become 'Ġ')."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def to_byte_chars(text: str) -> str:
    table = bytes_to_unicode()
    return "".join(table[b] for b in text.encode("utf-8"))


class PreTokenizer:
    """Splits text into words; BPE never merges across word boundaries."""

    def __init__(self, pre: str | None):
        name = pre or "default"
        if name not in PRE_TOKENIZERS:
            raise UnsupportedModelError(
                f"tokenizer.ggml.pre={name!r} is not supported; known: {sorted(PRE_TOKENIZERS)}")
        self.name = name
        self._patterns = [regex.compile(p) for p in PRE_TOKENIZERS[name]]

    def split(self, text: str) -> list[str]:
        pieces = [text]
        for pattern in self._patterns:
            pieces = [part for piece in pieces for part in _split_keep_gaps(pattern, piece)]
        return pieces


def _split_keep_gaps(pattern: regex.Pattern, text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            out.append(text[pos:m.start()])
        if m.end() > m.start():
            out.append(m.group())
        pos = m.end()
    if pos < len(text):
        out.append(text[pos:])
    return out


class BytePairEncoder:
    """Applies merges by rank to one pre-tokenized word; results are cached per word.

    ``ignore_merges`` (Llama 3): a word that is itself a token is taken whole, as HF does.
    """

    def __init__(self, vocab: dict[str, int], merges: list[str], ignore_merges: bool = False,
                 unk_id: int | None = None):
        self._vocab = vocab
        # Keyed by the merge line itself ("left right"): byte-level tokens never hold a real
        # space, and building this dict is then one C-level zip (it is on the model load path).
        self._ranks: dict[str, int] = dict(zip(merges, range(len(merges)), strict=True))
        self._ignore_merges = ignore_merges
        self._unk = unk_id
        self._cache: dict[str, tuple[int, ...]] = {}

    def encode_word(self, word: str) -> tuple[int, ...]:
        ids = self._cache.get(word)
        if ids is None:
            ids = self._encode(to_byte_chars(word))
            if len(self._cache) < 100_000:
                self._cache[word] = ids
        return ids

    def _encode(self, chars: str) -> tuple[int, ...]:
        if self._ignore_merges and chars in self._vocab:
            return (self._vocab[chars],)
        ids: list[int] = []
        for part in self._merge(chars):
            if part in self._vocab:
                ids.append(self._vocab[part])
            else:  # a vocabulary missing some byte tokens: map what exists, the rest to unk
                ids.extend(i for c in part if (i := self._vocab.get(c, self._unk)) is not None)
        return tuple(ids)

    def _merge(self, chars: str) -> list[str]:
        """The lowest-ranked adjacent pair merged first, the leftmost of equal ranks (GPT-2's order),
        from a heap over a linked list: O(n log n), where rescanning every pair after each merge
        was quadratic (a hostile prompt of one long word held a worker: docs/performance.md,
        bpe.py)."""
        parts: list[str | None] = list(chars)
        n, ranks = len(parts), self._ranks
        after, before = list(range(1, n + 1)), list(range(-1, n - 1))
        heap = [(r, i) for i in range(n - 1) if (r := ranks.get(parts[i] + " " + parts[i + 1])) is not None]
        heapq.heapify(heap)
        while heap:
            rank, i = heapq.heappop(heap)
            j = after[i]
            if parts[i] is None or j >= n or ranks.get(parts[i] + " " + parts[j]) != rank:
                continue  # an entry for a pair that a merge since then changed
            parts[i], parts[j] = parts[i] + parts[j], None
            after[i] = after[j]
            if after[i] < n:
                before[after[i]] = i
            for left in (before[i], i):  # the two pairs the merged part now belongs to
                if left >= 0 and after[left] < n:
                    r = ranks.get(parts[left] + " " + parts[after[left]])
                    if r is not None:
                        heapq.heappush(heap, (r, left))
        return [p for p in parts if p is not None]


def token_bytes(token: str) -> bytes:
    """The bytes a normal byte-level token stands for (a character outside the byte alphabet, as
    some vocabularies have, stands for its own UTF-8)."""
    table = unicode_to_bytes()
    out = bytearray()
    for c in token:
        if c in table:
            out.append(table[c])
        else:
            out += c.encode("utf-8")
    return bytes(out)
