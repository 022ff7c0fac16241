"""BytePairEncoder's heap-ordered merges give exactly the pieces of the textbook algorithm (rescan
every adjacent pair, merge the lowest-ranked, the leftmost of equal ranks), on SmolLM2's real
merges and on words built to repeat: one long word costs O(n log n) now, not O(n²)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.text.tokenizer import Tokenizer


def rescanning_merge(ranks: dict[str, int], chars: str) -> list[str]:
    parts = list(chars)
    while len(parts) > 1:
        pairs = [(ranks[p], i) for i in range(len(parts) - 1)
                 if (p := parts[i] + " " + parts[i + 1]) in ranks]
        if not pairs:
            return parts
        _, i = min(pairs)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


@pytest.fixture(scope="module")
def bpe(smollm2_path):
    return Tokenizer.from_metadata(GGUFModel.open(smollm2_path).metadata)._bpe


_REPEATING = st.lists(st.sampled_from(["a", "e", " ", "Ġ", "t", "h", "in", "Ċ"]), max_size=300).map("".join)
_PIECES = st.lists(st.sampled_from(["the", "Ġthe", "ing", "tion", "Ġa", "aaa", "Ċ", "ĠĠ", "é"]),
                   max_size=40).map("".join)


@settings(max_examples=300, deadline=None, database=None)
@given(word=st.one_of(_REPEATING, _PIECES, st.text(max_size=60)))
def test_heap_merges_equal_the_rescanning_algorithm(bpe, word):
    assert bpe._merge(word) == rescanning_merge(bpe._ranks, word)


def test_one_long_word_is_merged_like_short_ones(bpe):
    word = "a" * 2000 + "Ġthe" * 200
    assert bpe._merge(word) == rescanning_merge(bpe._ranks, word)
