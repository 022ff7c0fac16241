"""``ovpool generate``: run a model locally (no broker), streaming text to the terminal."""

from __future__ import annotations

import sys

import click

from ovpool.cli.common import (
    cache_dir_options,
    check_cache_dir,
    prompt_options,
    resolve_settings,
    response_format_options,
    sampling_options,
    settings_options,
    timings_text,
)

# A one-shot generation shorter than this finishes before the decode graph (ovpool.worker.graph.decode)
# pays for itself: it would be made after 128 tokens, its compile takes ~2 s of CPU, and it gains
# ~2.5 ms per later token on SmolLM2 (and the process would wait at exit for a compile still
# running). Set decode_graph to override.
DECODE_GRAPH_MIN_TOKENS = 1024


@click.command("generate")
@prompt_options
@click.option("--model", default="smollm2", show_default=True, help="GGUF path or alias.")
@sampling_options
@click.option("--device", default=None, help="OpenVINO device (default: the device setting, CPU).")
@cache_dir_options
@click.option("--cache-only", is_flag=True, default=None, help="Import from the cache or fail.")
@response_format_options
@settings_options
def generate_command(prompt: str | list, model: str, sampling: dict, device: str | None,
                     cache_dir: str | None, cache_only: bool | None, response_format: dict | None,
                     assignments: tuple[str, ...]) -> None:
    """Generate a continuation of PROMPT locally (PROMPT '-' reads stdin, '@FILE' reads FILE);
    timings go to stderr."""
    from ovpool.cache import prefetch
    from ovpool.config import GraphConfig

    settings = check_cache_dir(resolve_settings(assignments, device=device, cache_dir=cache_dir,
                                                cache_only=cache_only))
    if settings.source("decode_graph") == "default" and sampling["max_tokens"] < DECODE_GRAPH_MIN_TOKENS:
        settings = settings.replace(decode_graph="off")
    from ovpool.worker.graph.first_pass import for_warm_up

    # A likely hit imports, and runs its first pass, while the engine's modules load.
    early = prefetch.start(model, settings.device, GraphConfig.of(settings), settings.cache_dir,
                           first_pass=for_warm_up(settings.warm_up))
    from ovpool.sampling_params import SamplingParams
    from ovpool.worker.engine import Engine

    params = SamplingParams(**{**sampling, "stop": tuple(sampling["stop"])},
                            response_format=response_format)
    with Engine(model, settings=settings, early=early) as engine:
        report = engine.load_report
        click.echo(f"loaded {engine.name} on {engine.device} ({report['outcome']}) in "
                   f"{sum(report['seconds'].values()):.2f} s", err=True)
        with engine.generation(prompt, params) as gen:
            for delta in gen:
                sys.stdout.write(delta.text)
                sys.stdout.flush()
            result = gen.completion()
    click.echo("")
    click.echo(_timing_line(result), err=True)


def _timing_line(result) -> str:
    return (f"[{result.usage.prompt_tokens} prompt + {result.usage.completion_tokens} new tokens, "
            f"finish: {result.finish_reason}; {timings_text(result.timings)}]"
            + (f"\nnote: {result.note}" if result.note else ""))


def register(group: click.Group) -> None:
    group.add_command(generate_command)
