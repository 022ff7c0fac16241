"""The prefix-cache summary a worker sends in each HEARTBEAT (docs/protocol.md, prefix routing).

The backend reports the route keys of the prompts whose KV it still caches; this adds, next to a
finished request's deepest prompt key, the keys of its conversation with the answer appended
(ovpool.prefix_key.after_answer): a chat's next turn resends exactly that history, so those keys
are the ones it shares with it. This worker holds everything before the answer (with
``prefix_cache=on`` it recomputes the answer itself, see docs/prefix-caching.md), which no other
worker does.
"""

from __future__ import annotations

from collections import OrderedDict

from ovpool.prefix_key import after_answer
from ovpool.protocol import HELD_KEYS_MAX, Heartbeat, Request
from ovpool.worker.backend import Backend

_ANSWERS_MAX = 1024  # finished conversations remembered (the backend's cache evicts its own)


class PrefixReport:
    def __init__(self, backend: Backend):
        self.backend = backend
        self._running: dict[str, tuple[Request, tuple[bytes, ...]]] = {}
        self._answers: OrderedDict[bytes, tuple[bytes, ...]] = OrderedDict()  # prompt key -> after

    def started(self, request: Request, keys: tuple[bytes, ...]) -> None:
        if keys:
            self._running[request.request_id] = (request, keys)

    def ended(self, request_id: str, answer: str | None = None) -> None:
        """``request_id`` is over: finished with ``answer``, or (None) failed or cancelled."""
        request, keys = self._running.pop(request_id, (None, ()))
        if request is None or answer is None:
            return
        after = after_answer(request.model, request.prompt, request.messages, answer).keys[len(keys):]
        self._answers[keys[-1]] = after
        self._answers.move_to_end(keys[-1])
        while len(self._answers) > _ANSWERS_MAX:
            self._answers.popitem(last=False)

    def clear(self) -> None:
        self._running.clear()

    def heartbeat(self) -> Heartbeat:
        held: dict[bytes, None] = {}
        for key in self.backend.held_route_keys(HELD_KEYS_MAX):
            held.update(dict.fromkeys(reversed(self._answers.get(key, ()))))  # deepest first
            held[key] = None
        return Heartbeat(list(held)[:HELD_KEYS_MAX], self.backend.prompt_tokens,
                         self.backend.cached_prompt_tokens)
