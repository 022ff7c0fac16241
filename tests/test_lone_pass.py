"""Which passes get the dummy sequence (ovpool.worker.generate.lone_pass), and what it is: the
bit-for-bit equality it buys is tests/test_determinism.py's."""

from ovpool.worker.generate.lone_pass import is_lone_step, padded
from ovpool.worker.generate.plan import Chunk


def chunk(tokens, sample=True, seq="a", start=5):
    return Chunk(seq, start, tokens, [0, 1], sample)


def test_a_lone_decode_step_is_padded_with_a_position_0_sequence_on_the_scratch_block():
    assert is_lone_step([chunk([7])], None)
    assert is_lone_step([chunk([7], sample=False)], [0])  # a one-token forward asking for its row
    chunks, rows = padded([chunk([7])], scratch=9)
    assert chunks[0] == chunk([7]) and rows == [0, 1]
    assert (chunks[1].start, chunks[1].tokens, chunks[1].blocks, chunks[1].sample) == (0, [0], [9], True)


def test_passes_of_several_tokens_or_sequences_or_no_row_are_not_lone_steps():
    assert not is_lone_step([chunk([7, 8])], None)
    assert not is_lone_step([chunk([7]), chunk([8], seq="b")], None)
    assert not is_lone_step([chunk([7], sample=False)], None)  # no logits row asked for
    assert not is_lone_step([chunk([7, 8])], [1])
