"""Constrained decoding: a sequence's tokens kept to its ``response_format`` (ovpool.response_format)
by masking the logits before sampling, with llguidance (a Rust core, no Python dependencies; used by
llama.cpp and vLLM). xgrammar, the other common engine, needs torch and transformers.

``Vocabulary`` is the model's tokens as llguidance sees them, built once per model from the GGUF
vocabulary (the bytes of every token id, its special tokens and EOS ids). ``Constraint`` is one
sequence's matcher: it masks a logits row, and takes each chosen token. ``MaskBatch`` computes the
masks of one batched pass's constrained rows in one llguidance call (its own threads, without the
GIL) while the forward pass runs, and applies them over the batch in NumPy.

EOS is allowed exactly when the constraint is complete (llguidance's mask holds it then); a
constraint that admits no more text ends its sequence with finish reason ``stop`` at once.

A constraint's cost is bounded (a huge repetition or a grammar with no base case could keep a
worker busy for minutes, docs/performance.md): llguidance's limits (``_limits``) cap the regex
analysis and the Earley items of every mask; a matcher built and its first mask computed in more than
``BUDGET_S`` is refused; a matcher that hits a limit later fails its sequence. All of them are an
InvalidRequestError naming response_format. A batcher builds them on a thread of its own
(ovpool.worker.generate.admission; llguidance drops the GIL), so the batched step never waits for one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from ovpool import response_format as formats
from ovpool.errors import InvalidRequestError

# How long building a matcher and its first mask may take: well above every constraint of the
# tests and a{1000000} under the limits below (docs/performance.md).
BUDGET_S = 2.0
# llguidance's initial_lexer_fuel (default 1,000,000) also bounds the regex expressions a lexer may
# build, and step_max_items (default 50,000) an Earley step: these values keep a{1000000} and
# `start: "a" start` under a second while every schema, regex and grammar of the tests fits
# (docs/performance.md).
_LEXER_FUEL = 10_000
_STEP_ITEMS = 5_000


def _limits():
    import llguidance

    # verbose_errors off: the error names the limit, not the parser state and grammar (kilobytes).
    return llguidance.LLParserLimits(initial_lexer_fuel=_LEXER_FUEL, step_max_items=_STEP_ITEMS,
                                     verbose_errors=False)


def too_complex(why: str, param: str = "response_format") -> InvalidRequestError:
    return InvalidRequestError(f"{param} is too complex for this worker ({why.splitlines()[0]});"
                               " simplify it (fewer or smaller repetitions, a grammar whose rules end)",
                               param=param)


class _GGUFTokens:
    """What llguidance.TokenizerWrapper reads: each id's bytes, the special ids, EOS, and encode."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.tokens = [tokenizer.piece(i, skip_special=False) for i in range(tokenizer.vocab_size)]
        # piece() gives b"" for a control, unknown or unused token when it skips specials.
        self.special_token_ids = [i for i, raw in enumerate(self.tokens)
                                  if raw and not tokenizer.piece(i, skip_special=True)]
        self.eos_token_id = min(tokenizer.eos_ids) if tokenizer.eos_ids else None
        self.bos_token_id = tokenizer.bos_id

    def __call__(self, text: bytes | str) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode(text, add_special=False)


class Vocabulary:
    """A model's vocabulary for llguidance. Building it reads every token once and holds the GIL
    (a fraction of a second to seconds: docs/performance.md, benchmarks/structured_output.py), so
    an Intake builds it once, on its first constrained request, and keeps it."""

    def __init__(self, tokenizer):
        import llguidance  # here, so that importing this module (the batcher does) costs nothing

        self.size = tokenizer.vocab_size
        self.eos_ids = sorted(tokenizer.eos_ids)
        self.lltokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_GGUFTokens(tokenizer)),
                                                  n_vocab=self.size, eos_token=self.eos_ids or None)
        self.words = (self.size + 31) // 32   # an int32 bit mask row: bit i of word i // 32 is id i
        self.executor = llguidance.LLExecutor()

    def constraint(self, fmt: dict, ignore_eos: bool = False, param: str = "response_format") -> Constraint:
        """A matcher for a canonical ``fmt``, its first mask computed (so the step that uses it
        does not pay for the lexer's set-up); a grammar llguidance refuses, or one over the limits
        or BUDGET_S, is an InvalidRequestError naming ``param`` (what ``fmt`` came from)."""
        import llguidance

        start = time.perf_counter()
        matcher = llguidance.LLMatcher(self.lltokenizer, formats.grammar(fmt), log_level=0, limits=_limits())
        if matcher.is_error():
            raise InvalidRequestError(f"{param}: {matcher.get_error()}", param=param)
        constraint = Constraint(self, matcher, ignore_eos)
        MaskBatch([constraint]).compute()
        constraint.check()
        spent = time.perf_counter() - start
        if spent > BUDGET_S:
            raise too_complex(f"its first token mask took {spent:.1f} s, more than {BUDGET_S} s", param)
        return constraint


class Constraint:
    """One sequence's matcher. ``ignore_eos``: EOS is never allowed, so the sequence ends when the
    constraint admits nothing more (or at max_tokens)."""

    def __init__(self, vocabulary: Vocabulary, matcher, ignore_eos: bool):
        self.vocabulary, self.matcher = vocabulary, matcher
        self.blocked_eos = vocabulary.eos_ids if ignore_eos else []

    def check(self) -> None:
        """Raise InvalidRequestError if the matcher hit a limit (its mask then allows nothing but
        what it had reached: sampling from it would end the output early, not fail it)."""
        if self.matcher.is_error():
            raise too_complex(self.matcher.get_error())

    def masked(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` [vocab] with every token the constraint forbids at -inf (a new array)."""
        batch = MaskBatch([self])
        batch.compute()
        return batch.apply(logits[None, :])[0]

    def advance(self, token: int) -> bool:
        """Take the chosen ``token``; whether the output is now complete."""
        if not self.matcher.consume_token(token):  # its mask allowed it: a limit was hit
            raise too_complex(self.matcher.get_error())
        return self.matcher.is_stopped()


def masks_for(constraints: Sequence[Constraint | None]) -> MaskBatch | None:
    """The MaskBatch of a pass whose sampled rows have these constraints (None: a free row);
    None when no row is constrained."""
    rows = [i for i, c in enumerate(constraints) if c is not None]
    return MaskBatch([constraints[i] for i in rows], rows) if rows else None


class MaskBatch:
    """The masks of the constrained rows of one pass. ``rows[i]`` is the logits row of
    ``constraints[i]`` (by default row i)."""

    def __init__(self, constraints: Sequence[Constraint], rows: Sequence[int] | None = None):
        self.constraints = list(constraints)
        self.rows = np.arange(len(self.constraints)) if rows is None else np.asarray(rows, np.intp)
        self.vocabulary = self.constraints[0].vocabulary
        self.bits = np.empty((len(self.constraints), self.vocabulary.words), np.int32)

    def compute(self) -> None:
        """Fill the masks: one llguidance call for the batch (its threads; it drops the GIL, so a
        forward pass running meanwhile is not held up)."""
        v = self.vocabulary
        v.executor.unsafe_compute_mask_ptr([(c.matcher, i) for i, c in enumerate(self.constraints)],
                                           self.bits.ctypes.data, v.words * 4, len(self.constraints))

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """A float32 copy of ``logits`` [rows, vocab] with the forbidden tokens of the constrained
        rows at -inf; the other rows as they were. Ids past the vocabulary stay forbidden."""
        out = np.array(logits, dtype=np.float32)
        allowed = np.unpackbits(self.bits.view(np.uint8), axis=1, count=out.shape[1],
                                bitorder="little").view(bool)
        for i, c in enumerate(self.constraints):
            allowed[i, c.blocked_eos] = False
        sub = out[self.rows]
        sub[~allowed] = -np.inf
        out[self.rows] = sub
        return out
