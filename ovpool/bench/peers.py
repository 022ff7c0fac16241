"""OpenVINO GenAI on the same GGUF, in the same run: LLMPipeline (single stream) and its
ContinuousBatchingPipeline at each concurrency level, with the prompts and lengths of the sweep.

GenAI reads the GGUF itself (its own graph, Q4_1 zero points rounded to u4) and uses its own
scheduler; prompts go in raw (no chat template), as ovpool's sweep sends them.
"""

from __future__ import annotations

import importlib.util
import time

from ovpool.bench.sweep import PROMPTS
from ovpool.bench.workload import ChatRun, Turn, question, system_prompt


def available() -> bool:
    return importlib.util.find_spec("openvino_genai") is not None


def _config(max_tokens: int):
    import openvino_genai as genai

    config = genai.GenerationConfig()
    config.max_new_tokens = max_tokens
    config.ignore_eos = True
    config.apply_chat_template = False
    return config


def single_stream(model_path: str, max_tokens: int, device: str = "CPU") -> dict:
    """LLMPipeline: time to first token and decode tokens/s (GenAI's own metrics), load seconds."""
    import openvino_genai as genai

    t0 = time.perf_counter()
    pipe = genai.LLMPipeline(model_path, device)
    load_s = time.perf_counter() - t0
    config = _config(max_tokens)
    pipe.generate(PROMPTS[0], _config(4))  # warm-up
    metrics = pipe.generate([PROMPTS[0]], config).perf_metrics
    ttft = metrics.get_ttft().mean / 1e3
    tpot = metrics.get_tpot().mean / 1e3
    return {"load_s": load_s, "ttft_s": ttft, "decode_tokens_per_s": 1.0 / tpot if tpot else None,
            "tokens_per_s": max_tokens / (metrics.get_generate_duration().mean / 1e3)}


class BatchedPipeline:
    """ContinuousBatchingPipeline: aggregate tokens/s with N prompts submitted together."""

    def __init__(self, model_path: str, device: str = "CPU", properties: dict | None = None):
        import openvino_genai as genai

        scheduler = genai.SchedulerConfig()
        scheduler.cache_size = 1  # GiB of KV cache: plenty for 16 x (prompt + max_tokens)
        scheduler.enable_prefix_caching = False  # distinct prompts anyway; keep the comparison plain
        self.pipe = genai.ContinuousBatchingPipeline(model_path, scheduler, device, properties or {})
        self.pipe.generate(list(PROMPTS[:1]), [_config(4)])  # warm-up

    def level(self, concurrency: int, max_tokens: int, prompts: list[str] | None = None) -> dict:
        """``concurrency`` requests submitted together (``prompts``: theirs, else PROMPTS')."""
        prompts = prompts or [PROMPTS[i % len(PROMPTS)] for i in range(concurrency)]
        t0 = time.perf_counter()
        self.pipe.generate(prompts, [_config(max_tokens)] * concurrency)
        wall = time.perf_counter() - t0
        return {"concurrency": concurrency, "tokens": concurrency * max_tokens, "wall_s": wall,
                "tokens_per_s": concurrency * max_tokens / wall}


class ChatPipeline:
    """ContinuousBatchingPipeline with prefix caching, driven step by step for the chat workload
    (ovpool.bench.workload): each chat's next turn is added after the step that follows its answer,
    as a served worker gets it from a client that sends it at once (it arrives while that step
    runs), and its time to first token runs from the answer's end to the step that first yields
    one of its tokens: the pool's clients see the same wait (docs/performance.md, Chat TTFT). The
    history is rendered with the GGUF's chat template by GenAI's own tokenizer, as ovpool's worker
    renders it."""

    def __init__(self, model_path: str, device: str = "CPU", prefix_caching: bool = True):
        import openvino_genai as genai

        scheduler = genai.SchedulerConfig()
        scheduler.cache_size = 1  # GiB: 16 chats x ~1,400 tokens fit many times over
        scheduler.enable_prefix_caching = prefix_caching
        self.pipe = genai.ContinuousBatchingPipeline(model_path, scheduler, device)
        self.tokenizer = self.pipe.get_tokenizer()
        self.pipe.generate(list(PROMPTS[:1]), [_config(4)])  # warm-up

    def run(self, run: int, conversations: int, turns: int, max_tokens: int) -> dict:
        out, config, chats = ChatRun(), _config(max_tokens), {}
        t0 = time.perf_counter()
        for c in range(conversations):
            self._ask(chats, c, [{"role": "system", "content": system_prompt(run)}], 0, question, config)
        waiting: list[tuple] = []  # next turns whose answers ended before this step
        while chats or waiting:
            if chats:
                self.pipe.step()
            now, answered = time.perf_counter(), []
            for c, live in list(chats.items()):
                messages, turn, handle, sent, ids = live
                if handle.can_read():
                    new = handle.read()[0].generated_ids
                    if not ids and new:
                        out.turns.append(Turn(c, turn, now - sent))
                    ids.extend(new)
                if handle.get_status() != _running():
                    del chats[c]
                    out.completion_tokens += len(ids)
                    messages.append({"role": "assistant", "content": self.tokenizer.decode(ids)})
                    if turn + 1 < turns:
                        answered.append((c, messages, turn + 1, now))
            for c, messages, turn, sent in waiting:
                self._ask(chats, c, messages, turn, question, config, sent)
            waiting = answered
        out.wall_s = time.perf_counter() - t0
        return out.summary()

    def _ask(self, chats: dict, c: int, messages: list, turn: int, question, config,
             sent: float | None = None) -> None:
        messages.append({"role": "user", "content": question(c, turn)})
        sent = sent or time.perf_counter()  # rendering and tokenizing count, as in ovpool's worker
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        rid = c * 1000 + turn
        chats[c] = (messages, turn, self.pipe.add_request(rid, prompt, config), sent, [])


def _running():
    import openvino_genai as genai

    return genai.GenerationStatus.RUNNING
