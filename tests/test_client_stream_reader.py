"""A stream's reader, as both clients run it: the credit it returns as it takes tokens, and
whether leaving the loop cancels the request."""

from __future__ import annotations

import pytest

from ovpool.completion import Completion, Delta, Usage
from ovpool.errors import WorkerLostError
from ovpool.protocol import Credit
from ovpool.stream_reader import StreamReader, StreamSink, unwrap


def test_the_reader_returns_half_its_window_each_time_it_has_taken_that_many():
    reader = StreamReader("r1", StreamSink(lambda item: None), window=8)
    sent = [reader.credit() for _ in range(9)]
    assert sent == [[], [], [], [Credit("r1", 4)], [], [], [], [Credit("r1", 4)], []]


def test_after_the_end_no_credit_goes_out_and_leaving_cancels_nothing():
    items = []
    sink = StreamSink(items.append)
    reader = StreamReader("r2", sink, window=2)
    assert reader.left_early  # leaving now would cancel the request
    sink.done(Completion("", [], "stop", Usage(1, 0)))
    assert reader.credit() == [] and not reader.left_early
    assert unwrap(items[-1]) is None


def test_the_queue_hands_out_deltas_then_raises_the_requests_error():
    items = []
    sink = StreamSink(items.append)
    sink.delta(Delta(0, 7, "hi"))
    sink.fail(WorkerLostError("gone"))
    assert unwrap(items[0]) == Delta(0, 7, "hi")
    with pytest.raises(WorkerLostError, match="gone"):
        unwrap(items[1])
