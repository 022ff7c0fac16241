"""Models read ahead (ovpool.worker.opened: serve's spare process reads the GGUF header and
tokenizer of the models it may become): a worker takes exactly its own, and only while the file
is the one that was read."""

from __future__ import annotations

import os
import shutil

from ovpool import Engine
from ovpool.worker.opened import OpenedModels


def test_a_worker_takes_its_models_header_and_tokenizer_and_lets_the_others_go(tiny_model, tmp_path):
    a, b = (shutil.copy(tiny_model(), tmp_path / f"{n}.gguf") for n in "ab")
    opened = OpenedModels.read([str(a), str(b), str(tmp_path / "missing.gguf")])
    assert opened.sources() == sorted([str(a), str(b)])  # one that does not read is left out
    taken = opened.take(str(a))
    assert taken.model.path == a and taken.tokenizer.encode("hello world") == \
        OpenedModels.read([str(a)]).take(str(a)).tokenizer.encode("hello world")
    assert opened.sources() == [] and opened.take(str(b)) is None


def test_a_model_file_changed_since_it_was_read_is_not_taken(tiny_model, tmp_path):
    path = shutil.copy(tiny_model(), tmp_path / "m.gguf")
    opened = OpenedModels.read([str(path)])
    os.utime(path, ns=(0, 0))  # the same bytes, another modification time: read it again
    assert opened.take(str(path)) is None


def test_an_engine_given_a_read_ahead_model_generates_as_one_that_read_it(tiny_model, tmp_path):
    path = str(tiny_model())
    kwargs = {"cache_dir": ""}
    with Engine(path, **kwargs) as plain, \
            Engine(path, opened=OpenedModels.read([path]).take(path), **kwargs) as ahead:
        assert ahead.complete("once upon", max_tokens=6, seed=1).text == \
            plain.complete("once upon", max_tokens=6, seed=1).text
