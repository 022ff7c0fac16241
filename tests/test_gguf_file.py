"""The fast header parser agrees with gguf.GGUFReader and rejects broken files clearly."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from ovpool.errors import ModelFormatError
from ovpool.worker.gguf.file import read_header
from ovpool.worker.gguf.model import resolve_model_path


def _reader_value(field):
    value = field.contents()
    if field.types[0] == GGUFValueType.ARRAY and field.types[-1] != GGUFValueType.STRING:
        return np.asarray(value)
    return value


def _assert_same_as_reader(path):
    header, reader = read_header(path), GGUFReader(path)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(header.metadata) == list(fields)
    for key, field in fields.items():
        mine, theirs = header.metadata[key], _reader_value(field)
        if isinstance(theirs, np.ndarray):
            np.testing.assert_array_equal(mine, theirs, err_msg=key)
        else:
            assert mine == theirs, key
    assert header.data_offset == reader.data_offset
    assert list(header.tensors) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        info = header.tensors[t.name]
        assert info.ggml_type == t.tensor_type
        assert info.shape == tuple(reversed(t.shape.tolist()))
        assert info.offset == t.data_offset
        assert info.nbytes == t.n_bytes


@pytest.mark.slow
def test_matches_gguf_reader_on_smollm2():
    _assert_same_as_reader(resolve_model_path("smollm2"))


def _write_sample(path):
    w = GGUFWriter(str(path), "llama")
    w.add_uint32("t.u32", 7)
    w.add_int64("t.i64", -3)
    w.add_float32("t.f32", 0.5)
    w.add_float64("t.f64", 1e-300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ✓")
    w.add_array("t.strs", ["a", "", "ü", "<|im_start|>"])
    w.add_array("t.ints", [1, 2, 3])
    w.add_tensor("a", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.add_tensor("b", np.ones((4, 32), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_matches_gguf_reader_on_every_value_type(tmp_path):
    path = tmp_path / "sample.gguf"
    _write_sample(path)
    _assert_same_as_reader(path)
    header = read_header(path)
    assert header.metadata["t.strs"] == ["a", "", "ü", "<|im_start|>"]
    assert header.metadata["t.str"] == "héllo ✓"
    assert header.tensors["b"].shape == (4, 32)


@pytest.mark.parametrize("cut", [3, 20, 60, 200, -1])
def test_truncated_file_is_a_format_error(tmp_path, cut):
    path = tmp_path / "sample.gguf"
    _write_sample(path)
    data = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:cut])
    with pytest.raises(ModelFormatError, match="cut.gguf"):
        read_header(tmp_path / "cut.gguf")


def test_garbage_is_not_a_gguf(tmp_path):
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"not a model at all, just some text" * 10)
    with pytest.raises(ModelFormatError, match="not a GGUF file"):
        read_header(path)


# Byte offsets in the header: the version follows the magic; the first key's length follows
# magic, version and the two counts.
@pytest.mark.parametrize("offset,value,size,message", [
    (4, 1, 4, "version 1"),
    (24, 1 << 40, 8, "runs past the end"),
])
def test_corrupt_header_field_is_named(tmp_path, offset, value, size, message):
    path = tmp_path / "sample.gguf"
    _write_sample(path)
    data = bytearray(path.read_bytes())
    data[offset:offset + size] = value.to_bytes(size, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFormatError, match=message):
        read_header(path)


def test_missing_file_is_a_format_error(tmp_path):
    with pytest.raises(ModelFormatError, match="cannot read"):
        read_header(tmp_path / "absent.gguf")
