"""A generic ``{"response": ...}`` reply fed in pieces reads as it does fed whole."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from ovpool.worker.text.tool_format import GENERIC
from ovpool.worker.text.tool_reader import ToolReader

TEXT = "word caf\u00e9 \\ \"quoted\"\n\ttab \U0001F600 \ud83d end " * 12
REPLY = '{"response": ' + json.dumps(TEXT) + "}"


def _read(pieces):
    reader, out = ToolReader(GENERIC), []
    for n, piece in enumerate(pieces):
        out.append(reader.feed(piece, final=n == len(pieces) - 1)[0])
    return "".join(out)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(REPLY)), max_size=120))
def test_response_pieces_read_as_whole(cuts):
    cuts = sorted(set(cuts))
    bounds = [0, *cuts, len(REPLY)]
    pieces = [REPLY[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert _read(pieces) == _read([REPLY]) == TEXT


def test_response_one_character_at_a_time():
    assert _read(list(REPLY)) == TEXT
