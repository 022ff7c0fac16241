"""The fast header parser agrees with gguf.GGUFReader and rejects broken files clearly."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from ovpool.errors import ModelFormatError
from ovpool.worker.gguf.file import read_header


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
@pytest.mark.parametrize("model", ["smollm2_path", "gemma3_path"])
def test_matches_gguf_reader_on_real_models(request, model):
    # Every key: the vocabulary (tokens, scores, token types; gemma3's 262,144), merges, tensors.
    _assert_same_as_reader(request.getfixturevalue(model))


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


def _string_array_file(path, items: list[bytes], lengths: list[int] | None = None):
    """A GGUF holding one string array, written by hand: GGUFWriter cannot write invalid UTF-8
    or a length that lies."""
    lengths = [len(b) for b in items] if lengths is None else lengths
    body = b"".join(struct.pack("<Q", n) + b for n, b in zip(lengths, items, strict=True))
    key = b"t.strs"
    path.write_bytes(struct.pack("<IIQQ", 0x46554747, 3, 0, 1) + struct.pack("<Q", len(key)) + key
                     + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.STRING, len(items)) + body)
    return path


def _random_items(rng: np.random.Generator, n: int, odd: bool = True) -> list[bytes]:
    # Vocabulary-like text plus what a bulk decoder could trip on: empty strings, NULs, strings
    # long enough to end the vectorized walk, and bytes shaped like a length prefix.
    kinds = [lambda: "".join(rng.choice(list("ab▁é中😀 <|>"), rng.integers(1, 12))).encode(),
             lambda: b"", lambda: b"x\x00y", lambda: b"\x00" * int(rng.integers(1, 9)),
             lambda: ("▁" * int(rng.integers(80, 120))).encode(),
             lambda: struct.pack("<Q", int(rng.integers(0, 128))),
             lambda: bytes(rng.integers(0, 128, rng.integers(250, 300), dtype=np.uint8))]
    weights = np.array([60, 5, 2, 2, 2, 3, 1] if odd else [1, 0, 0, 0, 0, 0, 0], float)
    return [kinds[k]() for k in rng.choice(len(kinds), n, p=weights / weights.sum())]


@pytest.mark.parametrize("odd", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_string_arrays_read_exactly(tmp_path, seed, odd):
    rng = np.random.default_rng(seed)
    items = _random_items(rng, int(rng.integers(0, 20_000)), odd)
    path = _string_array_file(tmp_path / "strs.gguf", items)
    assert read_header(path).metadata["t.strs"] == [b.decode("utf-8") for b in items]
    assert list(GGUFReader(path).fields["t.strs"].contents()) == [b.decode("utf-8") for b in items]


@pytest.mark.parametrize("bad", [b"\xff", b"\xc3", b"ok\xe2\x96", b"\x80abc", b"\xed\xa0\x80"])
def test_invalid_utf8_in_a_string_array_names_the_item(tmp_path, bad):
    items = _random_items(np.random.default_rng(7), 3_000)
    items = [b.decode("utf-8").encode() for b in items]
    items[1234] = bad
    with pytest.raises(ModelFormatError, match="invalid UTF-8 text in item 1234"):
        read_header(_string_array_file(tmp_path / "strs.gguf", items))


@pytest.mark.parametrize("length", [1 << 20, 1 << 40, (1 << 63) + 5, (1 << 64) - 1])
@pytest.mark.parametrize("at", [0, 1500, 2999])
def test_a_huge_declared_length_is_a_format_error(tmp_path, length, at):
    # The file is untrusted: a lying length must fail at once, allocating nothing of its size.
    items = [b"tok%d" % i for i in range(3_000)]
    lengths = [len(b) for b in items]
    lengths[at] = length
    with pytest.raises(ModelFormatError, match=f"unexpected end of file in item {at}"):
        read_header(_string_array_file(tmp_path / "strs.gguf", items, lengths))
