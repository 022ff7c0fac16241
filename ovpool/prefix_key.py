"""Route keys: chained hashes of a request's text prefixes, for prefix-aware placement.

The broker has no tokenizer (it imports nothing of the worker), so these keys are over text, not
token ids: one key per chat message (its role and content, chained with every message before
it), or, for a raw prompt, one per full ``CHUNK_CHARS`` piece of text (a partial last piece has
no key: the next prompt that extends it would not share it). Every chain starts from the model
name, so two models never share a key. Key ``i`` names the whole prefix up to message (or piece)
``i``; two requests share key ``i`` exactly when they share that prefix, so "the deepest key a
worker holds" says how much of a request's prompt that worker may have cached.

The worker's own KV reuse is over token ids (worker/generate: blocks hashed by their tokens);
these keys only choose the worker. They travel in REQUEST, the worker hands them to its cache
with the request and reports those whose KV it still holds (HEARTBEAT), and the keys of the
conversation with its answer appended (``after_answer``) are what the next turn of a chat,
which resends the history plus that answer, starts with.

Pure stdlib: the wire format, the broker and the client may import it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

KEY_BYTES = 16  # blake2b-128: collisions are out of reach for a pool's lifetime of prefixes
CHUNK_CHARS = 256  # ~64 tokens of English text, a few KV blocks
# Keys per request: 128 messages, or 32k characters (~8k tokens) of a raw prompt. A longer
# prompt's keys stop there, so prompts that agree that far look alike to the router.
MAX_KEYS = 128
_DOMAIN = b"ovpool.route/1"


@dataclass(frozen=True)
class RouteKeys:
    """``keys[i]`` names the prompt prefix of ``depths[i]`` characters (increasing)."""

    keys: tuple[bytes, ...] = ()
    depths: tuple[int, ...] = ()

    def deepest_in(self, held: object) -> int:
        """Characters of the longest prefix whose key is in ``held`` (a set or mapping); 0: none."""
        for key, depth in zip(reversed(self.keys), reversed(self.depths), strict=True):
            if key in held:
                return depth
        return 0


NO_KEYS = RouteKeys()


def _chain(parent: bytes, *parts: str) -> bytes:
    h = hashlib.blake2b(parent, digest_size=KEY_BYTES)
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))  # length-prefixed: ("ab","c") != ("a","bc")
        h.update(data)
    return h.digest()


def route_keys(model: str, prompt: str | None = None, messages: Sequence[dict] | None = None) -> RouteKeys:
    """The keys of a request: of each message of ``messages``, else of ``prompt``'s full pieces."""
    if messages is not None:
        return _message_keys(_chain(_DOMAIN, "messages", model), messages, 0)
    return _prompt_keys(model, prompt or "")


def after_answer(model: str, prompt: str | None, messages: Sequence[dict] | None, answer: str,
                 keys: RouteKeys | None = None) -> RouteKeys:
    """The keys of the request followed by its ``answer``: for a chat, the history plus the answer
    as an assistant message (what the next turn resends); for a raw prompt, prompt + answer.
    ``keys``, the request's own (``route_keys``), saves hashing the history again
    (docs/performance.md, prefix_key.py)."""
    if messages is None:
        return _prompt_keys(model, (prompt or "") + answer)
    if keys is None or not keys.keys or len(keys.keys) != len(messages) or len(messages) >= MAX_KEYS:
        return route_keys(model, messages=[*messages, {"role": "assistant", "content": answer}])
    tail = _message_keys(keys.keys[-1], [{"role": "assistant", "content": answer}], keys.depths[-1])
    return RouteKeys(keys.keys + tail.keys, keys.depths + tail.depths)


def _message_keys(parent: bytes, messages: Sequence[dict], depth: int) -> RouteKeys:
    keys, depths = [], []
    for m in messages[:MAX_KEYS]:
        role, content = str(m.get("role", "")), str(m.get("content", ""))
        parent = _chain(parent, role, content)
        depth += len(role) + len(content)
        keys.append(parent)
        depths.append(depth)
    return RouteKeys(tuple(keys), tuple(depths))


def _prompt_keys(model: str, prompt: str) -> RouteKeys:
    if len(prompt) < CHUNK_CHARS:
        return NO_KEYS  # no full piece: no key, and no root to hash (a short prompt, twice a request)
    parent = _chain(_DOMAIN, "prompt", model)
    keys, depths = [], []
    for end in range(CHUNK_CHARS, min(len(prompt), CHUNK_CHARS * MAX_KEYS) + 1, CHUNK_CHARS):
        parent = _chain(parent, prompt[end - CHUNK_CHARS:end])
        keys.append(parent)
        depths.append(end)
    return RouteKeys(tuple(keys), tuple(depths))
