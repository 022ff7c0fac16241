"""``ovpool bench``: throughput and latency against OpenVINO GenAI, in one run (see ovpool.bench)."""

from __future__ import annotations

import click

from ovpool.cli.common import emit_json


def _levels(_ctx, _param, value: str) -> tuple[int, ...]:
    try:
        levels = tuple(sorted({int(v) for v in value.split(",") if v.strip()}))
    except ValueError:
        levels = ()
    if not levels or min(levels) < 1:
        raise click.BadParameter(f"{value!r}: give positive integers separated by commas, e.g. 1,2,4,8,16")
    return levels


@click.command("bench")
@click.option("--model", default="smollm2", show_default=True, help="GGUF path or alias.")
@click.option("--device", default="CPU", show_default=True)
@click.option("--levels", default="1,2,4,8,16", show_default=True, callback=_levels,
              help="Concurrency levels of the sweep.")
@click.option("--max-tokens", type=click.IntRange(1), default=128, show_default=True,
              help="New tokens per request (EOS ignored, so every request has this length).")
@click.option("--scenario", "scenarios", multiple=True,
              type=click.Choice(["startup", "single", "sweep", "overhead", "agreement", "chat"]),
              help="Run only these (repeatable; default: all).")
@click.option("--conversations", type=click.IntRange(1), default=16, show_default=True,
              help="Chat scenario: conversations at once (each with a ~1,000-token system prompt).")
@click.option("--turns", type=click.IntRange(1), default=4, show_default=True,
              help="Chat scenario: turns per conversation, each resending the history.")
@click.option("--repeats", type=click.IntRange(1), default=1, show_default=True,
              help="Runs per sweep level (the fastest is reported).")
@click.option("--no-genai", is_flag=True, help="Skip OpenVINO GenAI even if it is installed.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG plot of the sweep here (needs matplotlib: the bench extra).")
@click.option("--json", "as_json", is_flag=True, help="Print every number as JSON.")
@click.option("--set", "sets", multiple=True, metavar="NAME=VALUE",
              help="A setting for the benchmarked worker and engine; repeatable.")
def bench_command(model: str, device: str, levels: tuple[int, ...], max_tokens: int,
                  scenarios: tuple[str, ...], repeats: int, no_genai: bool, plot_path: str | None,
                  as_json: bool, sets: tuple[str, ...], conversations: int, turns: int) -> None:
    """Benchmark ovpool (and GenAI on the same GGUF): start-up, single stream, concurrency sweep
    through the broker, broker overhead, batched-vs-alone agreement, multi-turn chat (prefix cache
    on vs off, vs GenAI's prefix caching; two workers, prefix-aware vs least-loaded routing)."""
    from ovpool.bench import report
    from ovpool.bench.run import SCENARIOS, Options, run
    from ovpool.settings import parse_assignments

    parse_assignments(sets)  # a bad --set fails now, not after minutes of benchmarking
    opts = Options(model=model, device=device, levels=levels, max_tokens=max_tokens,
                   scenarios=scenarios or SCENARIOS, genai=not no_genai, repeats=repeats, sets=sets,
                   conversations=conversations, turns=turns)
    try:
        results = run(opts, say=lambda msg: click.echo(f"... {msg}", err=True))
    except TimeoutError as exc:  # a pool that did not start in time: one line (others are OvpoolErrors)
        raise click.ClickException(str(exc)) from None
    if plot_path and results.get("sweep"):
        results["plot"] = str(report.plot(results, plot_path))
    if as_json:
        emit_json(results)
    else:
        click.echo(report.text(results))


def register(group: click.Group) -> None:
    group.add_command(bench_command)
