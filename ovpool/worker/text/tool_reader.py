"""A reply's tool calls read as it streams: the text a generation writes in, its visible text and
ToolCallDeltas out, and at the end its ToolCalls (ovpool.worker.text.tool_format says the forms).

The grammar holds the reply to its family's form, so reading is deterministic: each time text
arrives the reader reads the reply from the end of its last complete call into a view, its text
outside the calls and each call's name and arguments so far, and sends what grew since the last
view. A view only grows as text arrives, so the pieces sent are exactly the final reply: a call's
first piece (id and name) once its name is complete, then its arguments' JSON text as written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ovpool.tools import ToolCall, ToolCallDelta, new_call_id
from ovpool.worker.text.tool_format import ARGUMENTS, GENERIC, HERMES, LLAMA3, LLAMA3_OPEN, OPEN


@dataclass
class _Call:
    name: str | None    # None until its closing quote arrived
    arguments: str      # its JSON text so far
    complete: bool


# _NAME[family]: a call object's beginning up to its arguments.
_NAME = {kind: re.compile(r'\{\s*"name"\s*:\s*"([^"]*)"\s*,\s*"' + key + r'"\s*:\s*')
         for kind, key in ARGUMENTS.items()}
_NAME_ONLY = re.compile(r'\{\s*"name"\s*:\s*"([^"]*)"')
_GENERIC = re.compile(r'\{\s*"(tool_calls|response)"\s*:\s*')
_NUMBER_CHARS = set("0123456789+-.eE")


class ToolReader:
    """One reply's reader for family ``kind``."""

    def __init__(self, kind: str):
        self.kind = kind
        self._raw = ""
        self._text = 0            # characters of visible text sent
        self._sent: list[int] = []  # per announced call: characters of its arguments sent
        self._ids: list[str] = []
        self._calls: list[_Call] = []
        self._done: list[_Call] = []  # the complete calls, read no more
        self._start = -1              # where the calls begin in the reply (-1: not yet)
        self._resume = 0              # where the call after the complete ones begins
        self._scans: dict[int, tuple] = {}  # an open value's scan so far, by where it begins
        self._decoded: dict[int, tuple[int, str]] = {}  # a string's clean offset and its text

    def feed(self, text: str, final: bool = False) -> tuple[str, tuple[ToolCallDelta, ...]]:
        """The visible text and the call pieces that ``text`` (the reply's next text) adds;
        ``final``: it is the last (text held back as a possible call's start is let go)."""
        self._raw += text
        visible, self._calls = self._view(final)
        out_text, self._text = visible[self._text:], len(visible)
        return out_text, tuple(self._pieces())

    @property
    def calls(self) -> list[ToolCall]:
        """The reply's complete calls so far."""
        return [ToolCall(self._ids[i], c.name, c.arguments) for i, c in enumerate(self._calls)
                if c.complete and i < len(self._ids)]

    def finish_reason(self, reason: str) -> str:
        """A reply that stopped after its calls ends with ``tool_calls``."""
        return "tool_calls" if reason == "stop" and self.calls else reason

    def _pieces(self):
        for i, call in enumerate(self._calls):
            if call.name is None:
                return
            if i == len(self._ids):
                self._ids.append(new_call_id())
                self._sent.append(0)
                yield ToolCallDelta(i, self._ids[i], call.name, "")
            if len(call.arguments) > self._sent[i]:
                yield ToolCallDelta(i, "", "", call.arguments[self._sent[i]:])
                self._sent[i] = len(call.arguments)

    def _view(self, final: bool) -> tuple[str, list[_Call]]:
        raw = self._raw
        if self.kind != GENERIC:  # text, then calls from the first opening on
            opening = OPEN if self.kind == HERMES else LLAMA3_OPEN
            if self._start < 0:
                self._start = self._resume = raw.find(opening)
            if self._start < 0:
                return raw if final else raw[:len(raw) - _held(raw, opening)], []
            if self.kind == LLAMA3:  # one call, its object from the opening on
                if self._done:
                    return raw[:self._start], self._done
                call, end = _call(raw, self._start, self._scans, LLAMA3)
                return raw[:self._start], self._read([] if call is None else [(call, end)])
            return raw[:self._start], self._read(_hermes_calls(raw, self._resume, self._scans))
        match = _GENERIC.match(raw)
        if match is None:
            return "", []
        if match.group(1) == "response":
            return _string_prefix(raw, match.end(), self._scans, self._decoded), []
        if self._start < 0:
            self._start = _skip_space(raw, match.end())
            if not raw.startswith("[", self._start):
                self._start = -1
                return "", []
            self._resume = self._start + 1
        return "", self._read(_generic_calls(raw, self._resume, bool(self._done), self._scans))

    def _read(self, found: list[tuple[_Call, int]]) -> list[_Call]:
        """The calls so far, those of ``found`` that are complete kept (``found``: the calls from
        the resume point, each with where it ends)."""
        for call, end in found:
            if call.complete:
                self._done.append(call)
                self._resume = end
        return self._done + [call for call, _ in found if not call.complete]


def _held(raw: str, marker: str) -> int:
    """How many characters at the end of ``raw`` may begin ``marker``."""
    return next((n for n in range(min(len(marker) - 1, len(raw)), 0, -1) if marker.startswith(raw[-n:])), 0)


def _hermes_calls(raw: str, pos: int, scans: dict) -> list[tuple[_Call, int]]:
    """The calls from ``pos`` on (each ``<tool_call>`` and its object) and where each ends."""
    calls = []
    while (pos := raw.find(OPEN, pos)) >= 0:
        call, end = _call(raw, pos + len(OPEN), scans)
        if call is None:
            break
        calls.append((call, end))
        if not call.complete:
            break
        pos = end
    return calls


def _generic_calls(raw: str, pos: int, after_call: bool, scans: dict) -> list[tuple[_Call, int]]:
    """The calls of the ``tool_calls`` list from ``pos`` on (``after_call``: a call ended there,
    so a comma comes first) and where each ends."""
    calls = []
    while True:
        pos = _skip_space(raw, pos)
        if after_call:
            if not raw.startswith(",", pos):
                return calls
            pos += 1
        call, end = _call(raw, pos, scans)
        if call is None:
            return calls
        calls.append((call, end))
        if not call.complete:
            return calls
        pos, after_call = end, True


def _call(raw: str, pos: int, scans: dict, kind: str = HERMES) -> tuple[_Call | None, int]:
    """The call object at ``pos`` (after whitespace) and where it ends; None before its name."""
    pos = _skip_space(raw, pos)
    match = _NAME[kind].match(raw, pos)
    if match is None:
        named = _NAME_ONLY.match(raw, pos)
        return (_Call(named.group(1), "", False) if named else None), len(raw)
    start = match.end()
    end = _value_end(raw, start, scans)
    if end is None:
        return _Call(match.group(1), raw[start:], False), len(raw)
    close = _skip_space(raw, end)
    return _Call(match.group(1), raw[start:end], close < len(raw) and raw[close] == "}"), close + 1


def _skip_space(raw: str, pos: int) -> int:
    while pos < len(raw) and raw[pos] in " \t\r\n":
        pos += 1
    return pos


def _value_end(raw: str, pos: int, scans: dict | None = None) -> int | None:
    """Where the JSON value at ``pos`` ends, None if it has not ended yet; ``scans`` keeps an
    open value's scan, so that the next call goes on from where this one stopped."""
    if pos >= len(raw):
        return None
    if raw[pos] not in "{[\"":
        end = pos
        while end < len(raw) and (raw[end] in _NUMBER_CHARS or raw[end].isalpha()):
            end += 1
        return end if end < len(raw) else None
    start, depth, in_string, escaped = (scans or {}).get(pos, (pos, 0, False, False))
    for i in range(start, len(raw)):
        ch = raw[i]
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
            if not in_string and depth == 0:
                return i + 1
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    if scans is not None:
        scans[pos] = (len(raw), depth, in_string, escaped)
    return None


def _string_prefix(raw: str, pos: int, scans: dict | None = None,
                   decoded: dict | None = None) -> str:
    """The decoded text of the JSON string at ``pos`` so far: an escape cut short, or the first
    half of a surrogate pair, waits for the rest. ``scans`` and ``decoded`` (where the string's
    text was last decoded up to, and that text) let the next call decode only what arrived."""
    if not raw.startswith('"', pos):
        return ""
    done, text = (decoded or {}).get(pos, (pos + 1, ""))
    end = _value_end(raw, pos, scans)
    if end is not None:
        return text + json.loads(f'"{raw[done:end - 1]}"', strict=False)
    i = done
    while i < len(raw):
        step = (6 if raw[i + 1:i + 2] == "u" else 2) if raw[i] == "\\" else 1
        if i + step > len(raw):
            break
        i += step
    tail = json.loads(f'"{raw[done:i]}"', strict=False)
    if tail and "\ud800" <= tail[-1] <= "\udbff":  # a pair's first half: decode it again with the rest
        i, tail = (i - 6, tail[:-1]) if raw[i - 6:i - 4] == "\\u" else (i, tail)
    if decoded is not None:
        decoded[pos] = (i, text + tail)
    return (text + tail)[:-1] if tail and "\ud800" <= tail[-1] <= "\udbff" else text + tail
