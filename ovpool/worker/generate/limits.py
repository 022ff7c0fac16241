"""Request limits a worker enforces, each checked in one place (no OpenVINO, no NumPy: the null
backend checks them too)."""

from __future__ import annotations

from ovpool.errors import InvalidRequestError


def check_prompt_length(n_tokens: int, max_prompt_tokens: int) -> None:
    """The worker's prompt-size limit (setting max_prompt_tokens), shared by every backend."""
    if n_tokens > max_prompt_tokens:
        raise InvalidRequestError(f"the prompt has {n_tokens} tokens, more than max_prompt_tokens = "
                                  f"{max_prompt_tokens}; shorten it or raise that setting")
