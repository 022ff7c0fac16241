"""Route keys (ovpool.prefix_key): what the broker matches a request's prompt against."""

from __future__ import annotations

from ovpool.prefix_key import CHUNK_CHARS, KEY_BYTES, MAX_KEYS, after_answer, route_keys

SYSTEM = {"role": "system", "content": "You are terse. " * 60}


def chat(*turns: str) -> list[dict]:
    out = [SYSTEM]
    for i, text in enumerate(turns):
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return out


def test_one_key_per_message_each_naming_the_whole_prefix():
    msgs = chat("hi", "hello", "bye")
    r = route_keys("m", messages=msgs)
    assert len(r.keys) == 4 and len(set(r.keys)) == 4
    assert all(len(k) == KEY_BYTES for k in r.keys)
    assert r.depths == tuple(sum(len(m["role"]) + len(m["content"]) for m in msgs[:i + 1]) for i in range(4))
    # A different first message changes every key after it, though the later messages are equal.
    other = route_keys("m", messages=[{"role": "system", "content": "x"}, *chat("hi", "hello", "bye")[1:]])
    assert not set(other.keys) & set(r.keys)


def test_a_chats_next_turn_starts_with_the_keys_of_the_previous_turn_and_its_answer():
    turn1 = chat("What is 2+2?")
    answer = "4."
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "And 3+3?"}]
    with_answer = after_answer("m", None, turn1, answer)
    next_keys = route_keys("m", messages=turn2)
    assert next_keys.keys[:len(with_answer.keys)] == with_answer.keys
    assert with_answer.keys[:2] == route_keys("m", messages=turn1).keys
    assert next_keys.deepest_in(set(with_answer.keys)) == with_answer.depths[-1]


def test_models_never_share_keys_and_fields_are_length_prefixed():
    msgs = chat("hi")
    assert not set(route_keys("a", messages=msgs).keys) & set(route_keys("b", messages=msgs).keys)
    one = route_keys("m", messages=[{"role": "ab", "content": "c"}])
    two = route_keys("m", messages=[{"role": "a", "content": "bc"}])
    assert one.keys != two.keys


def test_a_raw_prompt_has_one_key_per_full_piece_and_its_continuation_shares_them():
    prompt = "x" * (CHUNK_CHARS * 3 + 10)
    r = route_keys("m", prompt=prompt)
    assert r.depths == (CHUNK_CHARS, 2 * CHUNK_CHARS, 3 * CHUNK_CHARS)  # the partial piece: no key
    longer = after_answer("m", prompt, None, "y" * CHUNK_CHARS)
    assert longer.keys[:3] == r.keys and len(longer.keys) == 4
    assert route_keys("m", prompt="x" * (CHUNK_CHARS - 1)).keys == ()
    assert len(route_keys("m", prompt="x" * CHUNK_CHARS).keys) == 1
    # A prompt never shares a key with a chat of the same text.
    assert not set(r.keys) & set(route_keys("m", messages=[{"role": "", "content": prompt}]).keys)


def test_keys_stop_at_max_keys():
    assert len(route_keys("m", prompt="z" * CHUNK_CHARS * (MAX_KEYS + 5)).keys) == MAX_KEYS
    many = [{"role": "user", "content": str(i)} for i in range(MAX_KEYS + 5)]
    assert len(route_keys("m", messages=many).keys) == MAX_KEYS


def test_deepest_in_is_the_longest_prefix_held():
    r = route_keys("m", messages=chat("a", "b", "c"))
    assert r.deepest_in(set()) == 0
    assert r.deepest_in({r.keys[1]}) == r.depths[1]
    assert r.deepest_in({r.keys[0], r.keys[2]}) == r.depths[2]


def test_after_answer_from_the_requests_own_keys_equals_hashing_it_all_again():
    msgs = chat("a", "b", "c")
    own = route_keys("m", messages=msgs)
    assert after_answer("m", None, msgs, "d", own) == after_answer("m", None, msgs, "d")
