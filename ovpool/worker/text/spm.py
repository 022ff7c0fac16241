"""SentencePiece-style vocabularies (tokenizer.ggml.model=llama), tokenized as llama.cpp does.

Spaces become '▁'; adjacent symbols merge greedily by the score of the token they form (highest
first, leftmost on ties); a character that is no token falls back to its UTF-8 bytes <0xNN>.
"""

from __future__ import annotations

import heapq

SPACE = "\u2581"


class SentencePieceEncoder:
    def __init__(self, vocab: dict[str, int], scores: list[float], byte_ids: dict[int, int],
                 unk_id: int | None):
        self._vocab = vocab
        self._scores = scores
        self._byte_ids = byte_ids
        self._unk = unk_id

    def encode(self, text: str) -> list[int]:
        """``text`` already has the space prefix if the model wants one."""
        if not text:
            return []
        symbols = list(text.replace(" ", SPACE))
        ids: list[int] = []
        for piece in self._merge(symbols):
            ids.extend(self._piece_ids(piece))
        return ids

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
