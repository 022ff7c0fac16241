"""The tokenizer a GGUF file carries: byte-level BPE (gpt2) or SentencePiece (llama) vocabularies.

Special tokens (CONTROL and USER_DEFINED) are matched in the text first, so "<|im_start|>" is one
id; the text between them goes through the pre-tokenizer and BPE (or SentencePiece). Building
this from metadata does little more than two dict comprehensions: it is on the serving load path.
"""

from __future__ import annotations

import codecs
from array import array
from collections.abc import Iterable
from typing import Any

import numpy as np
import regex

from ovpool.errors import ModelFormatError, UnsupportedModelError
from ovpool.worker.text.bpe import BytePairEncoder, PreTokenizer, token_bytes
from ovpool.worker.text.spm import SPACE, SentencePieceEncoder

# gguf.TokenType values.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
# Token texts llama.cpp also treats as end of generation when they are special tokens.
_EOG_TEXTS = frozenset({"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                        "<|eom_id|>", "<EOT>", "<|end_of_text|>"})
_K = "tokenizer.ggml."


def _required(metadata: dict[str, Any], key: str) -> Any:
    if key not in metadata:
        raise ModelFormatError(f"GGUF metadata has no {key!r}: the file carries no usable tokenizer")
    return metadata[key]


class Tokenizer:
    def __init__(self, metadata: dict[str, Any]):
        self.model = _required(metadata, _K + "model")
        if self.model not in ("gpt2", "llama"):
            raise UnsupportedModelError(
                f"tokenizer.ggml.model={self.model!r} is not supported; known: gpt2 (BPE), llama (SPM)")
        self.tokens: list[str] = list(_required(metadata, _K + "tokens"))
        self.vocab_size = len(self.tokens)
        types = metadata.get(_K + "token_type")
        types = np.full(self.vocab_size, NORMAL) if types is None else np.asarray(types)
        self._types: list[int] = types.tolist()
        self._vocab = dict(zip(self.tokens, range(self.vocab_size), strict=True))
        self.bos_id = metadata.get(_K + "bos_token_id")
        spm = self.model == "llama"
        self.add_bos = bool(metadata.get(_K + "add_bos_token", spm)) and self.bos_id is not None
        self.add_eos = bool(metadata.get(_K + "add_eos_token", False))
        self.add_space_prefix = spm and bool(metadata.get(_K + "add_space_prefix", True))
        self.eos_ids = self._end_of_generation_ids(metadata)
        self._eos_id = metadata.get(_K + "eos_token_id")
        specials = np.flatnonzero(np.isin(types, (CONTROL, USER_DEFINED))).tolist()
        self._specials = SpecialTexts(self.tokens[i] for i in specials if self.tokens[i])
        self._piece_cache: dict[int, bytes] = {}
        self._build_encoder(metadata, types)

    def _build_encoder(self, metadata: dict[str, Any], types: np.ndarray) -> None:
        unk = metadata.get(_K + "unknown_token_id")
        if self.model == "gpt2":
            self._pre = PreTokenizer(metadata.get(_K + "pre"))
            merges = list(_required(metadata, _K + "merges"))
            ignore_merges = self._pre.name in ("llama-bpe", "llama3")
            self._bpe = BytePairEncoder(self._vocab, merges, ignore_merges, unk)
        else:
            scores = metadata.get(_K + "scores")
            # An array, not a list of Python floats: 8 bytes a score instead of an object and its
            # pointer (a large vocabulary's scores); indexing gives the same floats.
            scores = np.zeros(self.vocab_size) if scores is None else np.asarray(scores, float)
            scores = array("d", scores.tobytes())
            byte_ids = {int(self.tokens[i][3:5], 16): i for i in np.flatnonzero(types == BYTE).tolist()}
            self._spm = SentencePieceEncoder(self._vocab, scores, byte_ids, unk)

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any]) -> Tokenizer:
        return cls(metadata)

    @property
    def bos_token(self) -> str:
        """BOS as text (for chat templates); "" when the model has none."""
        return "" if self.bos_id is None else self.tokens[self.bos_id]

    @property
    def eos_token(self) -> str:
        return "" if self._eos_id is None else self.tokens[self._eos_id]

    def _end_of_generation_ids(self, metadata: dict[str, Any]) -> frozenset[int]:
        ids = {metadata.get(_K + k) for k in ("eos_token_id", "eot_token_id", "eom_token_id")}
        ids |= {i for t in _EOG_TEXTS if (i := self._vocab.get(t)) is not None
                and self._types[i] == CONTROL}
        return frozenset(i for i in ids if i is not None)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of ``text``; special-token texts in it become their ids. ``add_special`` adds
        BOS/EOS as the model's add_bos_token/add_eos_token flags say."""
        ids: list[int] = [self.bos_id] if add_special and self.add_bos else []
        after_special = True
        for piece, special_id in self._split_special(text):
            if special_id is not None:
                ids.append(special_id)
                after_special = True
            else:
                ids.extend(self._encode_plain(piece, after_special))
                after_special = False
        if add_special and self.add_eos and self._eos_id is not None:
            ids.append(self._eos_id)
        return ids

    def _split_special(self, text: str) -> Iterable[tuple[str, int | None]]:
        pos = 0
        for start, end in self._specials.find(text):
            if start > pos:
                yield text[pos:start], None
            yield text[start:end], self._vocab[text[start:end]]
            pos = end
        if pos < len(text):
            yield text[pos:], None

    def _encode_plain(self, text: str, after_special: bool) -> list[int]:
        if self.model == "llama":
            # llama.cpp gives a space prefix to text at the start or right after a special token.
            return self._spm.encode(" " + text if self.add_space_prefix and after_special else text)
        encode_word = self._bpe.encode_word
        return [i for word in self._pre.split(text) for i in encode_word(word)]

    def piece(self, token_id: int, skip_special: bool = True) -> bytes:
        """The bytes one token stands for (b"" for a skipped special token)."""
        if not 0 <= token_id < self.vocab_size:
            raise ModelFormatError(f"token id {token_id} is outside the vocabulary (size {self.vocab_size})")
        kind = self._types[token_id]
        if kind in (CONTROL, UNKNOWN, UNUSED) and skip_special:
            return b""
        cached = self._piece_cache.get(token_id)
        if cached is None:
            cached = self._piece_uncached(token_id, kind)
            self._piece_cache[token_id] = cached
        return cached

    def _piece_uncached(self, token_id: int, kind: int) -> bytes:
        text = self.tokens[token_id]
        if kind in (CONTROL, USER_DEFINED, UNKNOWN, UNUSED):
            return text.encode("utf-8")
        if self.model == "gpt2":
            return token_bytes(text)
        if kind == BYTE:
            return bytes([int(text[3:5], 16)])
        return text.replace(SPACE, " ").encode("utf-8")

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of a whole sequence: the inverse of ``encode`` (SentencePiece's space prefix goes)."""
        stream = StreamDecoder(self, skip_special, strip_space_prefix=self.add_space_prefix)
        return "".join(stream.push(i) for i in ids) + stream.flush()

    def stream_decoder(self, skip_special: bool = True) -> StreamDecoder:
        """Incremental text of generated tokens: a continuation, so a leading space is kept."""
        return StreamDecoder(self, skip_special)


class SpecialTexts:
    """Finds special-token texts in a text: leftmost first, the longest one there.

    Not one regex alternation: gemma3 has 6,414 special tokens, which ``regex`` took seconds to compile
    and matched slowly (docs/performance.md, tokenizer.py). A character class of their first
    characters finds candidates; at each, the lengths of the tokens that begin with the same two
    characters are tried, longest first (a set lookup each). Two, not one: gemma3's runs of 2-31
    spaces are special tokens, and every single space between words is a candidate."""

    def __init__(self, texts: Iterable[str]):
        self._texts = set(texts)
        lengths: dict[str, set[int]] = {}
        for text in self._texts:
            lengths.setdefault(text[:2], set()).add(len(text))
        self._lengths = {prefix: sorted(n, reverse=True) for prefix, n in lengths.items()}
        first = "".join(regex.escape(c) for c in sorted({t[0] for t in self._texts}))
        self._first = regex.compile(f"[{first}]") if first else None

    def find(self, text: str) -> Iterable[tuple[int, int]]:
        """(start, end) of each special text, left to right, not overlapping."""
        pos = 0
        while self._first is not None and (m := self._first.search(text, pos)) is not None:
            start = m.start()
            end = self._longest_at(text, start)
            if end is not None:
                yield start, end
            pos = start + 1 if end is None else end

    def _longest_at(self, text: str, start: int) -> int | None:
        candidates = self._lengths.get(text[start:start + 2], [])
        for n in candidates:
            if text[start:start + n] in self._texts:
                return start + n
        return start + 1 if text[start] in self._texts else None


class StreamDecoder:
    """Turns token ids into text as they come, holding back an incomplete UTF-8 sequence until the
    token that completes it arrives (bytes that can never complete become U+FFFD)."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True, strip_space_prefix: bool = False):
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip_space = strip_space_prefix

    def push(self, token_id: int) -> str:
        text = self._utf8.decode(self._tokenizer.piece(token_id, self._skip_special))
        if self._strip_space and text:
            # The space SentencePiece put before the first word is not part of the text.
            self._strip_space = False
            text = text[1:] if text.startswith(" ") else text
        return text

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)
