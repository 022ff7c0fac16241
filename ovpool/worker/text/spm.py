"""SentencePiece-style vocabularies (tokenizer.ggml.model=llama), tokenized as llama.cpp does.

Spaces become '▁'; adjacent symbols merge greedily by the score of the token they form (highest
first, leftmost on ties); a character that is no token falls back to its UTF-8 bytes <0xNN>.

Merging runs word by word (a word: a '▁' and what follows up to the next one), each word's ids
kept in a cache: exact, because a merge across a word boundary needs a token with a '▁' past its
first character, and the text is not cut where such a token occurs (gemma3's 262k pieces hold one,
'>▁</'), and merging a long text as one sequence was slow (docs/performance.md, spm.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import pairwise

SPACE = "\u2581"
_CACHE_WORDS = 1 << 16  # a cache this full is emptied (distinct words of ~100k-word texts fit)


class SentencePieceEncoder:
    def __init__(self, vocab: dict[str, int], scores: Sequence[float], byte_ids: dict[int, int],
                 unk_id: int | None):
        self._vocab = vocab
        self._scores = scores
        self._byte_ids = byte_ids
        self._unk = unk_id
        # Tokens that could merge across a word boundary (see the module docstring).
        self._spanning = [t for t in vocab if SPACE in t[1:]]
        self._words: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        """``text`` already has the space prefix if the model wants one."""
        ids: list[int] = []
        for word in self._split(text.replace(" ", SPACE)):
            word_ids = self._words.get(word)
            if word_ids is None:
                word_ids = [i for piece in self._merge(list(word)) for i in self._piece_ids(piece)]
                if len(self._words) >= _CACHE_WORDS:
                    self._words.clear()
                self._words[word] = word_ids
            ids.extend(word_ids)
        return ids

    def _split(self, text: str) -> list[str]:
        """``text`` cut before each '▁', except inside an occurrence of a spanning token."""
        kept = set()
        for token in self._spanning:
            at = text.find(token)
            while at >= 0:
                kept.update(at + j for j in range(1, len(token)) if token[j] == SPACE)
                at = text.find(token, at + 1)
        cuts = [0, *(i for i, c in enumerate(text) if c == SPACE and i and i not in kept), len(text)]
        return [text[a:b] for a, b in pairwise(cuts) if b > a]

    def _merge(self, symbols: list[str]) -> list[str]:
        # Linked list over positions; a heap of candidate bigrams ordered by (-score, left index).
        nxt = list(range(1, len(symbols) + 1))
        prv = list(range(-1, len(symbols) - 1))
        heap: list[tuple[float, int, str]] = []

        def push(left: int) -> None:
            right = nxt[left]
            if 0 <= left and right < len(symbols):
                merged = symbols[left] + symbols[right]
                tid = self._vocab.get(merged)
                if tid is not None:
                    heapq.heappush(heap, (-self._scores[tid], left, merged))

        for i in range(len(symbols) - 1):
            push(i)
        while heap:
            _, left, merged = heapq.heappop(heap)
            right = nxt[left]
            # Stale entry: one side was merged away or grew since this bigram was queued.
            if not symbols[left] or right >= len(symbols) or symbols[left] + symbols[right] != merged:
                continue
            symbols[left], symbols[right] = merged, ""
            nxt[left] = nxt[right]
            if nxt[right] < len(symbols):
                prv[nxt[right]] = left
            push(prv[left])
            push(left)
        return [s for s in symbols if s]

    def _piece_ids(self, piece: str) -> list[int]:
        tid = self._vocab.get(piece)
        if tid is not None:
            return [tid]
        fallback = [self._byte_ids.get(b, self._unk) for b in piece.encode("utf-8")]
        return [i for i in fallback if i is not None]
