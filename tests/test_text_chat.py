"""Chat templates render like Hugging Face / OpenVINO GenAI, and fail clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ovpool.errors import InvalidRequestError, ModelFormatError
from ovpool.testing.tiny_vocab import CHATML_TEMPLATE
from ovpool.worker.gguf.model import GGUFModel
from ovpool.worker.text.chat import render

GOLDEN = json.loads((Path(__file__).parent / "data" / "tokenizer_golden_smollm2.json").read_text())
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.mark.slow
@pytest.mark.parametrize("chat", GOLDEN["chats"],
                         ids=lambda c: f"{len(c['messages'])}-{c['add_generation_prompt']}")
def test_smollm2_template_renders_like_openvino_genai(smollm2_path, chat):
    template = GGUFModel.open(smollm2_path).metadata["tokenizer.chat_template"]
    assert render(template, chat["messages"], chat["add_generation_prompt"]) == chat["text"]


def test_chatml_generation_prompt_is_optional():
    with_prompt = render(CHATML_TEMPLATE, HELLO, add_generation_prompt=True)
    without = render(CHATML_TEMPLATE, HELLO, add_generation_prompt=False)
    assert without == "<|im_start|>user\nHello<|im_end|>\n"
    assert with_prompt == without + "<|im_start|>assistant\n"


def test_template_helpers_like_hugging_face():
    template = ("{{ bos_token }}{% for m in messages %}{{ m | tojson }}{% endfor %}"
                "{{ strftime_now('%Y') | length }}{{ eos_token }}")
    out = render(template, [{"role": "user", "content": "é 你"}], bos_token="<s>", eos_token="</s>")
    assert out == '<s>{"role": "user", "content": "é 你"}4</s>'


def test_template_raise_exception_is_an_invalid_request():
    template = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}"
    with pytest.raises(InvalidRequestError, match="system first"):
        render(template, HELLO)


def test_missing_or_broken_template_is_a_clear_error():
    with pytest.raises(InvalidRequestError, match="no chat template"):
        render(None, HELLO)
    with pytest.raises(ModelFormatError, match="tokenizer.chat_template"):
        render("{% for %}", HELLO)


@pytest.mark.parametrize("messages", [[], "hi", [{"role": "user"}], [{"role": 1, "content": "x"}], ["x"]])
def test_malformed_messages_are_rejected(messages):
    with pytest.raises(InvalidRequestError, match="messages"):
        render(CHATML_TEMPLATE, messages)


def test_template_cannot_mutate_its_inputs():
    # The sandbox is immutable: a template cannot change the caller's messages.
    with pytest.raises(ModelFormatError):
        render("{{ messages.append(1) }}", HELLO)
