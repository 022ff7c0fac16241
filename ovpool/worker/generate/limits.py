"""Request limits a worker enforces, each checked in one place (no OpenVINO, no NumPy: the null
backend checks them too)."""

from __future__ import annotations

from collections.abc import Sequence

from ovpool.errors import InvalidRequestError


def check_prompt_length(n_tokens: int, max_prompt_tokens: int) -> None:
    """The worker's prompt-size limit (setting max_prompt_tokens), shared by every backend."""
    if n_tokens > max_prompt_tokens:
        raise InvalidRequestError(f"the prompt has {n_tokens} tokens, more than max_prompt_tokens = "
                                  f"{max_prompt_tokens}; shorten it or raise that setting")


def check_prompt_chars(chars: int, max_prompt_tokens: int, longest_token: int) -> None:
    """Refuse, before tokenizing it, a prompt text too long to fit max_prompt_tokens whatever its
    tokens: no token covers more than ``longest_token`` characters (issue 24: a 20 MB prompt took
    its worker out instead of being refused). Exact: a prompt that fits is never refused here."""
    if chars > max_prompt_tokens * longest_token + 1:  # + 1: SentencePiece's space prefix
        raise InvalidRequestError(f"the prompt has {chars} characters, more than any prompt of"
                                  f" max_prompt_tokens = {max_prompt_tokens} tokens can hold; shorten it"
                                  " or raise that setting")


def check_max_tokens(max_tokens: int, max_new_tokens: int) -> None:
    """The worker's limit on new tokens per request (setting max_new_tokens)."""
    if max_tokens > max_new_tokens:
        raise InvalidRequestError(f"max_tokens = {max_tokens} exceeds max_new_tokens = {max_new_tokens}; "
                                  "lower it or raise that setting")


def check_prompt(ids: Sequence[int], *, vocab_size: int, context_length: int, max_prompt_tokens: int,
                 new_tokens: int, max_tokens: int | None = None) -> None:
    """Reject a prompt the model cannot take with ``new_tokens`` more, naming the numbers (and the
    request's ``max_tokens``, for a generation: a prompt that fills the context can never fit)."""
    if not ids:
        raise InvalidRequestError("the prompt is empty: give at least one token")
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidRequestError(f"token id {bad} is outside the vocabulary [0, {vocab_size})")
    if len(ids) + new_tokens > context_length:
        asked = f" and max_tokens = {max_tokens}" if max_tokens is not None else ""
        raise InvalidRequestError(
            f"the prompt has {len(ids)} tokens{asked}, but the model's context holds {context_length}"
            f" tokens in all: the prompt alone leaves no room for {new_tokens} new token(s); shorten"
            f" it to at most {context_length - new_tokens} tokens")
    check_prompt_length(len(ids), max_prompt_tokens)


def context_note(prompt_tokens: int, generated: int, max_tokens: int, context_length: int) -> str:
    """What a completion that the context ended before ``max_tokens`` says (finish_reason length
    alone reads as "max_tokens reached")."""
    return (f"stopped at the model's context of {context_length} tokens ({prompt_tokens} prompt +"
            f" {generated} generated), before max_tokens = {max_tokens}; shorten the prompt for a"
            " longer answer")


def check_logit_bias(logit_bias: Sequence[tuple[int, float]], vocab_size: int) -> None:
    """Reject a logit_bias (SamplingParams') naming a token the model does not have."""
    bad = [t for t, _ in logit_bias if t >= vocab_size]
    if bad:
        raise InvalidRequestError(f"sampling: logit_bias names token id(s) {bad[:5]} outside the "
                                  f"vocabulary [0, {vocab_size})", param="logit_bias")
