"""How long a worker holds its next pass, after one that ended a chat's answer, for the chat's next
turn (pure logic over the times the worker loop passes in; the loop is ovpool.worker.process).

A client sends a chat's next turn as soon as the answer ends, but the worker starts its next pass
at once: the turn arrives a few milliseconds into that pass, waits for all of it and then for its
own, two passes to its first token (docs/performance.md, Chat TTFT). Held until it arrives, it joins
the next pass: one pass and the round trip. The hold is short (``wait_s`` at most, over as soon as
as many requests arrived as answers ended) and only follows an answer a next turn likely resends:
one whose prompt began on two cached blocks or more (a chat's history, a long shared system prompt;
ovpool.worker.generate.answer_copies makes the same guess). A workload of such prompts that are
never continued would pay ``wait_s`` per answer, so the holds' total is kept within ``share`` of
the time spent in passes. vLLM and GenAI start the next step at once.
"""

from __future__ import annotations

from ovpool.completion import Usage

# An answer is likely continued when its prompt took this many tokens from the prefix cache: two
# of the paged graph's 32-position blocks (answer_copies.CONTINUED_BLOCKS).
CONTINUED_TOKENS = 64
# The holds' total, as a share of the time in passes: at most this much throughput is spent on them.
SHARE = 0.05


class FollowUps:
    """Holds of up to ``wait_s`` seconds (0: never) after answers likely continued."""

    def __init__(self, wait_s: float, share: float = SHARE):
        self.wait_s, self.share = wait_s, share
        self.expected = 0  # answers ended whose next turns have not arrived
        self.until = 0.0  # the hold's end
        self.began = 0.0  # the hold's start
        self.held = 0.0  # seconds held so far, ended holds
        self.stepped = 0.0  # seconds in passes so far

    def step(self, seconds: float) -> None:
        """A pass took ``seconds``."""
        self.stepped += seconds

    def ended(self, usage: Usage, now: float) -> None:
        """An answer ended at ``now`` (``usage``: its request's): hold the next pass for its next
        turn if it is likely continued and the holds are within their share."""
        if self.wait_s <= 0 or usage.cached_prompt_tokens < CONTINUED_TOKENS:
            return
        if not self._expire(now):
            if self.held > self.share * self.stepped:
                return
            self.began = now
        self.expected += 1
        self.until = now + self.wait_s

    def arrived(self, now: float) -> None:
        """A request arrived at ``now``; the hold ends once as many arrived as answers ended."""
        if self._expire(now):
            self.expected -= 1
            if not self.expected:
                self.held += now - self.began

    def hold(self, now: float) -> float:
        """Seconds to wait before the next pass (0: run it)."""
        return self.until - now if self._expire(now) else 0.0

    def _expire(self, now: float) -> int:
        """End a hold past its wait (whenever the loop looks: it may have been idle since); how
        many requests the hold still waits for."""
        if self.expected and now >= self.until:
            self.expected = 0
            self.held += self.until - self.began
        return self.expected

    def drop(self) -> None:
        """The sessions are gone (a reconnect): nothing to wait for."""
        self.expected = 0
