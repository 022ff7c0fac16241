"""The chat workload's content and its tally, shared by the pool's runs (ovpool.bench.chat) and
GenAI's (ovpool.bench.peers): the system prompt, each turn's question and a run's summary.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ovpool.bench.stats import percentile

_TOPICS = ("rivers", "bridges", "comets", "violins", "glaciers", "lighthouses", "beekeeping", "typefaces",
           "volcanoes", "orchards", "tides", "clocks", "deserts", "ferns", "harbors", "maps")
# ~24 SmolLM2 tokens each: with its first line, the system prompt is ~1,015 tokens.
_RULES = tuple(f"Rule {i}: when the user asks about {_TOPICS[i % 16]}, answer in plain words and "
               f"cite fact {i}." for i in range(42))


def system_prompt(run: int) -> str:
    return f"Session {run}. You are a careful assistant who follows these rules.\n" + "\n".join(_RULES)


def question(conversation: int, turn: int, document: bool = False) -> str:
    """A chat's question for ``turn``; with ``document`` its first one carries a ~1,150-token
    document of that chat's own (a prefix only the worker that read it holds)."""
    topic = _TOPICS[conversation % len(_TOPICS)]
    text = f"Chat {conversation}, question {turn + 1}: tell me something new about {topic}."
    if not (document and turn == 0):
        return text
    facts = "\n".join(f"Fact {conversation}.{j}: the {topic} of chat {conversation}, item {j}, measure "
                      f"{(conversation * 37 + j * 11) % 997} units." for j in range(40))
    return f"Read this document first.\n{facts}\n{text}"


@dataclass
class Turn:
    conversation: int
    turn: int
    ttft_s: float | None = None
    error: str | None = None


@dataclass
class ChatRun:
    """One run of the workload as the client saw it."""

    turns: list[Turn] = field(default_factory=list)
    completion_tokens: int = 0
    wall_s: float = 0.0

    def summary(self) -> dict:
        by_turn: dict[int, list[float]] = {}
        for t in self.turns:
            if t.ttft_s is not None:
                by_turn.setdefault(t.turn + 1, []).append(t.ttft_s)
        later = [v for turn, vs in by_turn.items() if turn > 1 for v in vs]
        return {"ttft_median_s_by_turn": {str(k): statistics.median(v) for k, v in sorted(by_turn.items())},
                "ttft_later_turns_median_s": statistics.median(later) if later else None,
                "ttft_later_turns_p99_s": percentile(later, 99) if later else None,
                "completion_tokens": self.completion_tokens, "wall_s": self.wall_s,
                "tokens_per_s": self.completion_tokens / self.wall_s if self.wall_s else None,
                "errors": [f"chat {t.conversation} turn {t.turn + 1}: {t.error}"
                           for t in self.turns if t.error]}
