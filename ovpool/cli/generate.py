"""``ovpool generate``: run a model locally (no broker), streaming text to the terminal."""

from __future__ import annotations

import sys

import click

from ovpool.cli.common import resolve_settings, response_format_options, settings_options

# A one-shot generation shorter than this finishes before the decode graph (ovpool.worker.graph.decode)
# pays for itself: it would be made after 128 tokens, its compile takes ~2 s of CPU, and it gains
# ~2.5 ms per later token on SmolLM2 (and the process would wait at exit for a compile still
# running). Set decode_graph to override.
DECODE_GRAPH_MIN_TOKENS = 1024


@click.command("generate")
@click.argument("prompt")
@click.option("--model", default="smollm2", show_default=True, help="GGUF path or alias.")
@click.option("--max-tokens", type=int, default=128, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 is greedy.")
@click.option("--top-k", type=int, default=0, show_default=True, help="0 disables it.")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=None, help="Same seed, same tokens.")
@click.option("--stop", multiple=True, help="Stop before this string; repeatable.")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-sequence tokens.")
@click.option("--chat", is_flag=True, help="Send PROMPT as a user message through the chat template.")
@click.option("--device", default=None, help="OpenVINO device (default: the device setting, CPU).")
@click.option("--cache-dir", default=None, help="Compiled-model cache directory.")
@click.option("--cache-only", is_flag=True, default=None, help="Import from the cache or fail.")
@response_format_options
@settings_options
def generate_command(prompt: str, model: str, max_tokens: int, temperature: float, top_k: int, top_p: float,
                     seed: int | None, stop: tuple[str, ...], ignore_eos: bool, chat: bool,
                     device: str | None, cache_dir: str | None, cache_only: bool | None,
                     response_format: dict | None, assignments: tuple[str, ...]) -> None:
    """Generate a continuation of PROMPT locally; timings go to stderr."""
    from ovpool.cache import prefetch

    settings = resolve_settings(assignments, device=device, cache_dir=cache_dir, cache_only=cache_only)
    if settings.source("decode_graph") == "default" and max_tokens < DECODE_GRAPH_MIN_TOKENS:
        settings = settings.replace(decode_graph="off")
    early = prefetch.start(model, settings=settings)  # a likely hit imports while the engine's modules do
    from ovpool.sampling_params import SamplingParams
    from ovpool.worker.engine import Engine

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                            seed=seed, stop=stop, ignore_eos=ignore_eos,
                            response_format=response_format)
    with Engine(model, settings=settings, early=early) as engine:
        report = engine.load_report
        click.echo(f"loaded {engine.name} on {engine.device} ({report['outcome']}) in "
                   f"{sum(report['seconds'].values()):.2f} s", err=True)
        source = [{"role": "user", "content": prompt}] if chat else prompt
        with engine.generation(source, params) as gen:
            for delta in gen:
                sys.stdout.write(delta.text)
                sys.stdout.flush()
            result = gen.completion()
    click.echo("")
    click.echo(_timing_line(result), err=True)


def _timing_line(result) -> str:
    t = result.timings
    tps = f", {t['decode_tps']:.1f} tokens/s" if "decode_tps" in t else ""
    return (f"[{result.usage.prompt_tokens} prompt + {result.usage.completion_tokens} new tokens, "
            f"finish: {result.finish_reason}; first token {t['ttft_s'] * 1000:.0f} ms{tps}, "
            f"total {t['total_s']:.2f} s]")


def register(group: click.Group) -> None:
    group.add_command(generate_command)
