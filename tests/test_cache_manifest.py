import json

import pytest

from ovpool.cache.manifest import Entry, Manifest, covers, differences, is_static, nearest, parse_bounds
from ovpool.errors import CacheCorruptError


def port(name, shape, direction="in", element_type="i64"):
    return {"name": name, "direction": direction, "element_type": element_type, "partial_shape": shape}


def entry(eid, ports):
    return Entry(eid, ports, f"{eid}.blob", 10, "crc32:00000000", "ov", "CPU", 1.0)


DYNAMIC = [port("input_ids", "[?,?]"), port("logits", "[?,?,64]", "out", "f32")]


@pytest.mark.parametrize("text,bounds", [
    ("[?,?]", [(0, None), (0, None)]),
    ("[1,2..8,64]", [(1, 1), (2, 8), (64, 64)]),
    ("[-1,3..]", [(0, None), (3, None)]),
    ("[...]", None),
])
def test_parse_bounds(text, bounds):
    assert parse_bounds(text) == bounds


def test_dynamic_entry_covers_narrower_requests_but_not_wider_or_other_ports():
    decode = [port("input_ids", "[1,1]"), port("logits", "[1,1,64]", "out", "f32")]
    assert covers(DYNAMIC, decode)
    assert not covers(decode, DYNAMIC)
    assert not covers(DYNAMIC, DYNAMIC + [port("position_ids", "[?,?]")])
    assert not covers(DYNAMIC, [port("input_ids", "[?,?]", element_type="i32"), DYNAMIC[1]])
    assert not covers([port("input_ids", "[1..4,?]"), DYNAMIC[1]], DYNAMIC)


def test_find_prefers_the_exact_entry_then_a_covering_one():
    narrow = [port("input_ids", "[1,?]"), port("logits", "[1,?,64]", "out", "f32")]
    m = Manifest("fam", {}, []).with_entry(entry("fam-dyn", DYNAMIC)).with_entry(entry("fam-narrow", narrow))
    assert m.find(narrow).id == "fam-narrow"
    assert m.find([port("input_ids", "[2,1]"), port("logits", "[2,1,64]", "out", "f32")]).id == "fam-dyn"
    assert m.find(DYNAMIC + [port("position_ids", "[?,?]")]) is None


def test_static_ports_are_recognised():
    assert is_static([port("input_ids", "[1,4]"), port("logits", "[?]", "out")])
    assert not is_static(DYNAMIC)


def test_manifest_round_trips_and_garbage_is_a_corrupt_error():
    m = Manifest("fam", {"openvino": "x"}, ["/m.gguf"]).with_entry(entry("fam-a", DYNAMIC))
    assert Manifest.from_json(m.to_json(), "fam") == m
    for garbage in ["", "{", "[]", '{"schema": 1}', m.to_json().replace('"size": 10', '"size": "x"'),
                    m.to_json().replace('"schema": 1', '"schema": 99')]:
        with pytest.raises(CacheCorruptError, match="fam"):
            Manifest.from_json(garbage, "fam")
    with pytest.raises(CacheCorruptError):
        Manifest.from_json(m.to_json(), "other-family")


@pytest.mark.parametrize("ports", [
    [None], ["x"], [{}], [{**port("a", "[?]"), "partial_shape": None}], [{**port("a", "[?]"), "name": 1}],
    [{**port("a", "[?]"), "direction": []}], [port("a", "[a]")], [port("a", "not a shape")], {"a": 1},
])
def test_a_manifest_whose_port_rows_are_not_rows_of_text_and_shapes_is_corrupt(ports):
    """Lookups sort, compare and parse the rows: each of these escaped them as a TypeError,
    AttributeError or ValueError, which a worker's start does not catch."""
    m = Manifest("fam", {"openvino": "x"}, ["/m.gguf"]).with_entry(entry("fam-a", DYNAMIC))
    doc = json.loads(m.to_json())
    doc["entries"]["fam-a"]["ports"] = ports
    with pytest.raises(CacheCorruptError, match="manifest of family fam is unreadable"):
        Manifest.from_json(json.dumps(doc), "fam")


@pytest.mark.parametrize("text", ["[" * 200_000 + "]" * 200_000, '{"schema": ' + "[" * 200_000])
def test_a_manifest_nested_past_the_json_decoder_is_corrupt(text):
    """The decoder's RecursionError escaped as one: a worker's start died of it."""
    with pytest.raises(CacheCorruptError, match="manifest of family fam is unreadable: JSON nested deeper"):
        Manifest.from_json(text, "fam")


@pytest.mark.parametrize("field, value", [("blob", ".."), ("blob", ["x"]), ("size", True), ("checksum", 5),
                                          ("created", "now"), ("device", None)])
def test_a_manifest_entry_field_of_the_wrong_type_is_corrupt(field, value):
    m = Manifest("fam", {"openvino": "x"}, ["/m.gguf"]).with_entry(entry("fam-a", DYNAMIC))
    doc = json.loads(m.to_json())
    doc["entries"]["fam-a"][field] = value
    with pytest.raises(CacheCorruptError, match="manifest of family fam is unreadable"):
        Manifest.from_json(json.dumps(doc), "fam")


def test_differences_name_each_part_in_the_promised_form():
    here = {"setting kv_cache_precision": "u8", "openvino": "1", "new": "x"}
    cached = {"setting kv_cache_precision": "f16", "openvino": "1", "old": "y"}
    assert differences(here, cached) == ["setting kv_cache_precision: u8 here, f16 in cache",
                                         "new: x here, (absent) in cache", "old: (absent) here, y in cache"]


def test_nearest_picks_the_manifest_with_fewest_differences():
    here = {"a": "1", "b": "2", "c": "3"}
    far = Manifest("far", {"a": "9", "b": "9", "c": "3"}, [])
    close = Manifest("close", {"a": "1", "b": "9", "c": "3"}, [])
    best, diffs = nearest(here, [far, close])
    assert best is close and diffs == ["b: 2 here, 9 in cache"]
    assert nearest(here, []) == (None, [])
