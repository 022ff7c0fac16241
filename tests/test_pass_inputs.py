"""A paged runner's inputs kept between passes (ovpool.worker.generate.pass_inputs): each pass runs
on its own values whatever ran before it, and ``feeds`` lays a pass out as the graph's ports expect."""

import numpy as np

from ovpool.worker.engine import Engine
from ovpool.worker.generate.batch import Chunk, PagedRunner, feeds
from ovpool.worker.generate.pass_inputs import PassInputs


class _Port:
    def __init__(self, name):
        self.name = name

    def get_names(self):
        return {self.name}


class _Request:
    """What PassInputs uses of an InferRequest; records the tensors set."""

    def __init__(self, names):
        self.model_inputs = [_Port(n) for n in names]
        self.tensors, self.sets = {}, 0

    def set_input_tensor(self, index, tensor):
        self.tensors[index], self.sets = tensor, self.sets + 1


def test_inputs_of_the_last_shapes_are_written_in_place_and_a_new_shape_gets_a_new_tensor():
    request = _Request(["a", "b"])
    inputs = PassInputs(request)
    inputs.set({"a": np.array([1, 2], np.int32), "b": np.array([[5]], np.int64)})
    assert request.sets == 2
    first = request.tensors[0]
    inputs.set({"a": np.array([3, 4], np.int32), "b": np.array([[6]], np.int64)})
    assert request.sets == 2 and request.tensors[0] is first  # same shapes: nothing set
    assert first.data.tolist() == [3, 4] and request.tensors[1].data.tolist() == [[6]]
    inputs.set({"a": np.array([7, 8, 9], np.int32), "b": np.array([[6]], np.int64)})
    assert request.sets == 3 and request.tensors[0].data.tolist() == [7, 8, 9]


def test_the_caller_s_arrays_are_copied_not_shared():
    request = _Request(["a"])
    values = np.array([1, 2], np.int32)
    PassInputs(request).set({"a": values})
    values[0] = 9  # the caller reuses its array while a pass may be running
    assert request.tensors[0].data.tolist() == [1, 2]


def test_feeds_lays_out_two_sequences_of_a_pass():
    got = feeds([Chunk("a", 4, [11, 12, 13], [0, 1], sample=True),
                 Chunk("b", 0, [21], [2], sample=False),
                 Chunk("c", 7, [31], [3, 4], sample=True)])
    want = {"input_ids": [[11, 12, 13, 21, 31]], "position_ids": [[4, 5, 6, 0, 7]],
            "past_lens": [4, 0, 7], "subsequence_begins": [0, 3, 4, 5],
            "block_indices": [0, 1, 2, 3, 4], "block_indices_begins": [0, 2, 3, 5],
            "max_context_len": 8, "logits_indices": [2, 4]}
    assert {k: v.tolist() for k, v in got.items()} == want
    wide = ("input_ids", "position_ids", "logits_indices")
    assert {k: v.dtype for k, v in got.items()} == {k: np.int64 if k in wide else np.int32 for k in want}
    assert feeds([Chunk("a", 0, [1, 2], [0], sample=True)], rows=[0, 1])["logits_indices"].tolist() == [0, 1]


def test_a_pass_gives_the_same_logits_whatever_passes_ran_on_the_runner_before(tiny_model):
    prompt = Chunk("a", 0, [3, 4, 5, 6, 7], [0], sample=True)
    other = Chunk("b", 0, [9, 8, 7], [1], sample=True)
    step = Chunk("a", 5, [8], [0], sample=True)
    with Engine(tiny_model(), settings={"decode_graph": "off"}, cache_dir="") as engine:
        fresh = PagedRunner(engine.compiled, num_blocks=8)
        fresh.forward([prompt])
        want = fresh.forward([step]).copy()
        runner = PagedRunner(engine.compiled, num_blocks=8)
        runner.forward([prompt])
        runner.forward([other])
        runner.forward([Chunk("b", 3, [1], [1], sample=True)])  # the step's shapes, other values
        got = [runner.forward([step]).copy()]
        runner.forward([Chunk("b", 4, [2], [1], sample=True), Chunk("c", 0, [5, 6], [2], sample=True)])
        got.append(runner.forward([step]).copy())
    assert all(np.array_equal(g, want) for g in got)
