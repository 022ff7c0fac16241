"""Request intake: a prompt (text, token ids or chat messages) and its SamplingParams into what a
runtime runs: the prompt's token ids, checked against every limit (ovpool.worker.generate.limits),
and the structured-output Constraint of its ``response_format`` or its tools (the model's
tool-call family renders them and holds the reply to them: ovpool.worker.text.tool_format).

An Intake is built once per model from its tokenizer, chat template and hyperparameters; the
Batcher and the single-stream Engine admit through the same one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ovpool import tools as tooling
from ovpool.errors import InvalidRequestError
from ovpool.sampling_params import SamplingParams
from ovpool.worker.generate.constraint import Constraint, Vocabulary
from ovpool.worker.generate.limits import check_logit_bias, check_max_tokens, check_prompt, check_prompt_chars
from ovpool.worker.text import tool_format
from ovpool.worker.text.chat import render
from ovpool.worker.text.tokenizer import Tokenizer
from ovpool.worker.text.tool_reader import ToolReader

Prompt = str | Sequence[int] | Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class Admitted:
    """A request within every limit: what a runtime needs to run it."""

    ids: list[int]
    params: SamplingParams
    constraint: Constraint | None


@dataclass(frozen=True)
class Limits:
    """The request limits of one model on one worker (settings and the model's hyperparameters)."""

    vocab_size: int
    context_length: int
    max_prompt_tokens: int
    max_new_tokens: int


class Intake:
    """``admit(prompt, params)``: the request's Admitted, or an InvalidRequestError naming what to
    change. ``phases``: where the one-time vocabulary build records its seconds."""

    def __init__(self, tokenizer: Tokenizer, chat_template: str | None, limits: Limits,
                 phases: dict[str, float] | None = None):
        self.tokenizer, self.chat_template, self.limits = tokenizer, chat_template, limits
        self.tool_family = tool_format.family(chat_template)
        self._phases = {} if phases is None else phases
        self._vocabulary: Vocabulary | None = None  # made on the first request with a response_format
        self._vocabulary_lock = threading.Lock()
        # A token string has at least one character per byte: bounds a prompt before tokenizing it.
        self._longest_token = max(map(len, tokenizer.tokens), default=1)

    @property
    def context_length(self) -> int:
        return self.limits.context_length

    def admit(self, prompt: Prompt, params: SamplingParams) -> Admitted:
        return Admitted(self.ids(prompt, params), params, self.constraint(params))

    def ids(self, prompt: Prompt, params: SamplingParams) -> list[int]:
        """The prompt's token ids, once the request is within every limit."""
        check_max_tokens(params.max_tokens, self.limits.max_new_tokens)
        ids = self.prompt_ids(prompt, params)
        self.check(ids, new_tokens=1, max_tokens=params.max_tokens)
        check_logit_bias(params.logit_bias, self.limits.vocab_size)
        return ids

    def prompt_ids(self, prompt: Prompt, params: SamplingParams | None = None) -> list[int]:
        """Token ids of a text, a list of ids, or chat messages (rendered with the chat template,
        and ``params``' tools)."""
        items = [] if isinstance(prompt, str) else list(prompt)
        is_chat = bool(items) and all(isinstance(m, Mapping) for m in items)
        tooling.check_chat(params is not None and params.calls_tools, is_chat)
        if isinstance(prompt, str):
            return self._tokenize_checked(prompt)
        if is_chat:
            # The template writes any BOS itself, as Hugging Face's apply_chat_template does.
            return self._tokenize_checked(self.render_chat(items, params), add_special=False)
        if all(isinstance(t, int | np.integer) and not isinstance(t, bool) for t in items):
            return [int(t) for t in items]
        raise InvalidRequestError("a prompt is a string, a list of token ids, or a list of chat messages "
                                  "({'role': ..., 'content': ...})")

    def check(self, ids: Sequence[int], new_tokens: int, max_tokens: int | None = None) -> None:
        limits = self.limits
        check_prompt(ids, vocab_size=limits.vocab_size, context_length=limits.context_length,
                     max_prompt_tokens=limits.max_prompt_tokens, new_tokens=new_tokens,
                     max_tokens=max_tokens)

    def render_chat(self, messages: Sequence[Mapping[str, Any]], params: SamplingParams | None = None) -> str:
        messages, extra = tool_format.prepare(self.tool_family, messages, params)
        return render(self.chat_template, messages, add_generation_prompt=True,
                      bos_token=self.tokenizer.bos_token, eos_token=self.tokenizer.eos_token, **extra)

    def output_format(self, params: SamplingParams) -> dict | None:
        """What the output is held to: its response_format, or the grammar of calls to its tools
        (a canonical response_format of type grammar); None for free text."""
        if params.calls_tools:
            return {"type": "grammar", "lark": tool_format.grammar(self.tool_family, params)}
        return params.response_format

    def tool_reader(self, params: SamplingParams) -> ToolReader | None:
        """The reader of the reply's calls, when it may make any."""
        return ToolReader(self.tool_family) if params.calls_tools else None

    def constraint(self, params: SamplingParams) -> Constraint | None:
        """The Constraint of ``output_format`` on this model's vocabulary; None without one."""
        fmt = self.output_format(params)
        if fmt is None:
            return None
        return self.vocabulary().constraint(fmt, ignore_eos=params.ignore_eos, param=format_param(params))

    def vocabulary(self) -> Vocabulary:
        """This model's vocabulary for constrained decoding, built on first use (a batcher's
        admission thread may ask for it while a single stream does)."""
        with self._vocabulary_lock:
            if self._vocabulary is None:
                with timed(self._phases, "structured-output vocabulary"):
                    self._vocabulary = Vocabulary(self.tokenizer)
            return self._vocabulary

    def _tokenize_checked(self, text: str, add_special: bool = True) -> list[int]:
        check_prompt_chars(len(text), self.limits.max_prompt_tokens, self._longest_token)
        return self.tokenizer.encode(text, add_special=add_special)


def format_param(params: SamplingParams) -> str:
    """The field an output format's error names."""
    return "tools" if params.calls_tools else "response_format"


class timed:
    """Adds the seconds spent in a ``with`` block to ``phases[name]``."""

    def __init__(self, phases: dict[str, float], name: str):
        self.phases, self.name = phases, name

    def __enter__(self) -> None:
        self._t0 = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self.phases[self.name] = time.perf_counter() - self._t0
