"""The tokenizers of tiny test models, as GGUF metadata: a byte-level BPE (tokenizer.ggml.model
gpt2) or a SentencePiece BPE with byte fallback (llama), both trained on the built-in corpus."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache

import gguf

from ovpool.testing import bpe_trainer

T = gguf.TokenType
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
SPM_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Qwen2.5's template, shortened: the tools in the system turn, calls as <tool_call> JSON, results
# in <tool_response> (a template of the hermes tool-call family: ovpool/worker/text/tool_format.py).
QWEN_TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{%- endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "<tools>{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
    "{%- elif messages[0]['role'] == 'system' %}"
    "<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant"
    "{%- if message.content %}\n{{ message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- set tool_call = tool_call.function %}"
    "\n<tool_call>\n{\"name\": \"{{ tool_call.name }}\", \"arguments\": "
    "{{ tool_call.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}"
    "\n</tool_response><|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
# Llama 3.1's template, shortened: tools in the system turn, a call as the JSON {"name", "parameters"},
# results in an ipython turn (the llama3 tool-call family).
LLAMA3_TOOLS_TEMPLATE = (
    "{{- bos_token }}{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] %}{%- set messages = messages[1:] %}{%- else %}"
    "{%- set system_message = '' %}{%- endif %}<|start_header_id|>system<|end_header_id|>\n\n"
    '{%- if tools %}Environment: ipython\n\nRespond with a function call as the JSON {"name": fun'
    'ction name, "parameters": dictionary of its arguments}.\n\n'
    '{%- for tool in tools %}{{ tool | tojson }}\n\n{%- endfor %}'
    '{%- endif %}{{- system_message }}<|eot_id|>{%- for message in messages %}'
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    '{%- set tool_call = message.tool_calls[0].function %}<|start_header_id|>assistant<|end_hea'
    'der_id|>\n\n{"name": "{{ tool_call.name }}", "parameters": {{ tool_call.arguments | tojson }'
    '}}<|eot_id|>'
    "{%- elif message.role == 'tool' or message.role == 'ipython' %}<|start_header_id|>ipython<"
    '|end_header_id|>\n\n{{ message.content }}<|eot_id|>'
    '{%- else %}<|start_header_id|>{{ message.role }}<|end_header_id|>\n\n{{ message.content }}<|'
    'eot_id|>{%- endif %}{%- endfor %}'
    '{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif %}'
)
KINDS = ("bpe", "spm")


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]
    types: list[int]
    bos: str
    eos: str
    merges: list[str] | None = None     # BPE only
    scores: list[float] | None = None   # SentencePiece only

    def digest(self) -> str:
        """Changes whenever the trainer or its corpus does (golden files record it)."""
        return hashlib.sha256(json.dumps([self.tokens, self.merges, self.scores]).encode()).hexdigest()


@lru_cache(maxsize=8)
def vocab(kind: str, n_merges: int) -> Vocab:
    if kind == "bpe":
        byte_tokens, merges = bpe_trainer.train(n_merges)
        tokens = [*SPECIAL_TOKENS, *byte_tokens]
        types = [T.CONTROL] * len(SPECIAL_TOKENS) + [T.NORMAL] * len(byte_tokens)
        return Vocab(tokens, types, "<|endoftext|>", "<|im_end|>", merges=merges)
    if kind == "spm":
        chars, pieces = bpe_trainer.train_sentencepiece(n_merges)
        byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
        tokens = [*SPM_SPECIAL_TOKENS, *byte_tokens, *chars, *pieces]
        types = ([T.UNKNOWN] + [T.CONTROL] * (len(SPM_SPECIAL_TOKENS) - 1) + [T.BYTE] * 256
                 + [T.NORMAL] * (len(chars) + len(pieces)))
        # Merged pieces score by rank (earlier merges win), as a SentencePiece BPE model has them.
        scores = [0.0] * (len(tokens) - len(pieces)) + [-float(i) for i in range(len(pieces))]
        return Vocab(tokens, types, "<s>", "</s>", scores=scores)
    raise ValueError(f"tokenizer must be one of {KINDS}")


def write_tokenizer(writer: gguf.GGUFWriter, v: Vocab, pre: str, add_bos: bool,
                    chat_template: str = CHATML_TEMPLATE) -> None:
    writer.add_tokenizer_model("gpt2" if v.merges is not None else "llama")
    writer.add_token_list(v.tokens)
    writer.add_token_types(v.types)
    if v.merges is not None:
        writer.add_tokenizer_pre(pre)
        writer.add_token_merges(v.merges)
    else:
        writer.add_token_scores(v.scores)
        writer.add_unk_token_id(v.tokens.index("<unk>"))
        writer.add_add_space_prefix(True)
    writer.add_bos_token_id(v.tokens.index(v.bos))
    writer.add_eos_token_id(v.tokens.index(v.eos))
    writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(False)
    writer.add_chat_template(chat_template)
