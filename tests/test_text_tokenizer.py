"""Tokenizer: ids equal OpenVINO GenAI's on SmolLM2, round trips, pre-tokenizers, SentencePiece,
special tokens, streaming decode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ovpool.errors import ModelFormatError, UnsupportedModelError
from ovpool.testing.tiny import TinySpec
from ovpool.testing.tiny_vocab import SPECIAL_TOKENS
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.text.bpe import PRE_TOKENIZERS, PreTokenizer, bytes_to_unicode
from ovpool.worker.text.tokenizer import BYTE, CONTROL, NORMAL, Tokenizer

DATA = Path(__file__).parent / "data"
GOLDEN = json.loads((DATA / "tokenizer_golden_smollm2.json").read_text())
TINY_GOLDEN = json.loads((DATA / "tokenizer_golden_tiny.json").read_text())
GEMMA3_GOLDEN = json.loads((DATA / "tokenizer_golden_gemma3.json").read_text())


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_path):
    return Tokenizer.from_metadata(GGUFModel.open(smollm2_path).metadata)


@pytest.fixture(scope="module")
def gemma3_tokenizer(gemma3_path):
    return Tokenizer.from_metadata(GGUFModel.open(gemma3_path).metadata)


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model):
    return Tokenizer.from_metadata(GGUFModel.open(tiny_model()).metadata)


@pytest.mark.slow
@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: repr(c["text"][:24]))
def test_ids_equal_openvino_genai_and_round_trip(smollm2_tokenizer, case):
    ids = smollm2_tokenizer.encode(case["text"])
    assert ids == case["ids"]
    assert smollm2_tokenizer.decode(ids, skip_special=False) == case["text"]


@pytest.mark.slow
def test_gemma3_ids_equal_llama_cpp_and_round_trip(gemma3_tokenizer):
    # tests/data/make_tokenizer_golden_gemma3.py: llama.cpp's own tokenizer (llama-cpp-python)
    tok = gemma3_tokenizer
    assert tok.vocab_size == 262144 and tok.add_bos and not tok.add_space_prefix
    for case in GEMMA3_GOLDEN["cases"]:
        ids = tok.encode(case["text"])
        assert ids == case["ids"], case["text"][:60]
        assert tok.decode(ids[1:], skip_special=False) == case["text"]


@pytest.mark.parametrize("golden", TINY_GOLDEN, ids=lambda g: g["spec"]["pre"])
def test_pre_tokenizers_equal_openvino_genai_on_the_tiny_vocabulary(tiny_model, golden):
    spec = TinySpec(**golden["spec"])
    assert spec.vocab.digest() == golden["vocab_sha256"], \
        "the tiny vocabulary changed: rerun tests/data/make_tokenizer_golden.py"
    tok = Tokenizer.from_metadata(GGUFModel.open(tiny_model(**golden["spec"])).metadata)
    for case in golden["cases"]:
        assert tok.encode(case["text"]) == case["ids"], case["text"]


@pytest.mark.slow
def test_smollm2_special_ids_and_end_of_generation(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert tok.vocab_size == 49152 and not tok.add_bos
    assert tok.tokens[tok.bos_id] == "<|im_start|>"
    assert {tok.tokens[i] for i in tok.eos_ids} == {"<|im_end|>", "<|endoftext|>"}
    assert tok.decode(tok.encode("<|im_start|>user\nhi<|im_end|>")) == "user\nhi"


@pytest.fixture(scope="module")
def tiny_tokenizers(tiny_model):
    """The tiny vocabulary under every pre-tokenizer."""
    metadata = GGUFModel.open(tiny_model()).metadata
    return {pre: Tokenizer.from_metadata({**metadata, "tokenizer.ggml.pre": pre}) for pre in PRE_TOKENIZERS}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(PRE_TOKENIZERS)),
       st.lists(st.one_of(st.text(), st.sampled_from(SPECIAL_TOKENS)), max_size=6).map("".join))
def test_tiny_bpe_round_trips_any_text(tiny_tokenizers, pre, text):
    tok = tiny_tokenizers[pre]
    ids = tok.encode(text, add_special=False)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids, skip_special=False) == text


def test_tiny_bpe_uses_merges_and_specials(tiny_tokenizer):
    tok = tiny_tokenizer
    word = tok.encode(" and", add_special=False)
    assert [tok.tokens[i] for i in word] == ["Ġand"]                # merges learned from the corpus
    ids = tok.encode("<|im_start|>user", add_special=False)
    assert ids[0] == tok.tokens.index("<|im_start|>") and len(ids) >= 2
    assert tok.encode("hi")[0] == tok.bos_id                          # fixture has add_bos
    assert tok.encode("hi", add_special=False)[0] != tok.bos_id


def test_stream_decoder_never_emits_broken_utf8(tiny_tokenizer):
    text = "héllo 😀 世界 ok"
    ids = tiny_tokenizer.encode(text, add_special=False)
    stream = tiny_tokenizer.stream_decoder()
    deltas = [stream.push(i) for i in ids]
    assert "".join(deltas) + stream.flush() == text
    assert "" in deltas                      # some token ended mid-character and was held back
    assert all("\ufffd" not in d for d in deltas)


def test_stream_decoder_flush_replaces_a_dangling_sequence(tiny_tokenizer):
    stream = tiny_tokenizer.stream_decoder()
    first_byte_of_emoji = tiny_tokenizer.tokens.index(bytes_to_unicode()[0xF0])
    assert stream.push(first_byte_of_emoji) == ""
    assert stream.flush() == "\ufffd"


@pytest.mark.parametrize("pre,text,words", [
    ("smollm", "abc 123", ["abc", " ", "1", "2", "3"]),
    ("llama-bpe", "Hello 12345 world!!\n\n", ["Hello", " ", "123", "45", " world", "!!\n\n"]),
    ("llama-bpe", "you're\n    x", ["you", "'re", "\n", "   ", " x"]),
    ("qwen2", "x 42", ["x", " ", "4", "2"]),
    ("default", "a 1234567", ["a", " ", "123", "456", "7"]),
    ("gpt2", "I'm  here", ["I", "'m", " ", " here"]),
])
def test_pre_tokenizers_split_as_llama_cpp(pre, text, words):
    assert PreTokenizer(pre).split(text) == words


def test_unknown_pre_tokenizer_and_model_are_clear_errors():
    with pytest.raises(UnsupportedModelError, match="tokenizer.ggml.pre='nope'"):
        PreTokenizer("nope")
    with pytest.raises(UnsupportedModelError, match="tokenizer.ggml.model='t5'"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(ModelFormatError, match="tokenizer.ggml.tokens"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "gpt2"})


def test_tiny_sentencepiece_fixture_round_trips_the_corpus(tiny_model):
    tok = Tokenizer.from_metadata(GGUFModel.open(tiny_model(tokenizer="spm")).metadata)
    assert tok.model == "llama" and tok.add_space_prefix
    for text in (c["text"] for c in GOLDEN["cases"] if "<|" not in c["text"]):
        ids = tok.encode(text)
        assert ids[0] == tok.bos_id and tok.decode(ids) == text
    # As llama.cpp (and HF's legacy Llama tokenizer): text after a special token gets a '▁' too.
    assert tok.decode(tok.encode("<|im_start|>hi"), skip_special=False) == "<s><|im_start|> hi"
    pieces = [tok.tokens[i] for i in tok.encode("and the Ω", add_special=False)]
    assert "▁and" in pieces and "<0xCE>" in pieces        # learned merges; no Greek in the corpus


SPM_PIECES = {"▁": -1.0, "h": -1.0, "e": -1.0, "l": -1.0, "o": -1.0, "w": -1.0, "ll": -1.0,
              "▁h": -2.0, "▁he": -3.0, "llo": -4.0, "▁hello": -5.0, "▁w": -2.5}


@pytest.fixture(scope="module")
def spm_tokenizer():
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *SPM_PIECES]
    types = [2, CONTROL, CONTROL, *[BYTE] * 256, *[NORMAL] * len(SPM_PIECES)]
    return Tokenizer.from_metadata({
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * 259 + list(SPM_PIECES.values()),
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0})


def test_sentencepiece_merges_by_score_with_byte_fallback(spm_tokenizer):
    tok = spm_tokenizer
    pieces = [tok.tokens[i] for i in tok.encode("hello hell wé")]
    assert pieces == ["<s>", "▁hello", "▁he", "ll", "▁w", "<0xC3>", "<0xA9>"]
    assert tok.decode(tok.encode("hello hell wé")) == "hello hell wé"


def test_sentencepiece_generated_text_keeps_its_leading_space(spm_tokenizer):
    # A whole sequence drops the prefix encode added; a continuation ("hello" -> " world") keeps it.
    ids = spm_tokenizer.encode("hello", add_special=False) + spm_tokenizer.encode("w", add_special=False)
    assert spm_tokenizer.decode(ids) == "hello w"
    stream = spm_tokenizer.stream_decoder()
    assert "".join(stream.push(i) for i in ids[1:]) + stream.flush() == " w"


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.sampled_from("helowé 世😀\n"), max_size=30))
def test_sentencepiece_round_trips(spm_tokenizer, text):
    assert spm_tokenizer.decode(spm_tokenizer.encode(text)) == text
