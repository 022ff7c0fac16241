"""Options and output helpers shared by the subcommands."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from ovpool.errors import ConfigError, OvpoolError
from ovpool.settings import Settings, parse_assignments

# Options of every command that talks to a broker.
broker_option = click.option("--broker", default=None, envvar="OVPOOL_BROKER",
                              help="Broker endpoint (env OVPOOL_BROKER; default tcp://127.0.0.1:5555).")
secret_option = click.option("--curve-secret-key", default=None, type=click.Path(dir_okay=False),
                              help="This process's CURVE key pair (.key_secret from `ovpool keys generate`).")
server_key_option = click.option("--curve-server-key", default=None, type=click.Path(dir_okay=False),
                                  help="The broker's CURVE public key (.key).")


class EnvOption(click.Option):
    """An option that may come from an environment variable: a bad value's error names both."""

    def get_error_hint(self, ctx: click.Context) -> str:
        return f"{super().get_error_hint(ctx)} (or environment variable {self.envvar})"


def settings_options(func: Callable) -> Callable:
    """Add ``--set NAME=VALUE`` (repeatable) and pass the resolved ``settings`` to the command.

    Dedicated flags such as ``--device`` are passed to the command as ``flag_<name>`` keyword
    arguments by the command itself and merged with ``resolve_settings``.
    """

    @click.option("--set", "assignments", multiple=True, metavar="NAME=VALUE",
                  help="Set any setting (see `ovpool settings`); repeatable.")
    @functools.wraps(func)
    def wrapper(*args: Any, assignments: tuple[str, ...], **kwargs: Any) -> Any:
        return func(*args, assignments=assignments, **kwargs)

    return wrapper


def cache_dir_options(func: Callable) -> Callable:
    """Add ``--cache-dir DIR`` and ``--no-cache``; the command gets ``cache_dir`` (None: the
    setting, by default $XDG_CACHE_HOME/ovpool; "": no cache)."""

    @click.option("--cache-dir", default=None, metavar="DIR",
                  help="Compiled-model cache directory (default: setting cache_dir, env "
                       "OVPOOL_CACHE_DIR, else $XDG_CACHE_HOME/ovpool or ~/.cache/ovpool).")
    @click.option("--no-cache", is_flag=True, help="Compile without the cache (as cache_dir=\"\").")
    @functools.wraps(func)
    def wrapper(*args: Any, cache_dir: str | None, no_cache: bool, **kwargs: Any) -> Any:
        if no_cache and cache_dir:
            raise click.UsageError("pass --cache-dir or --no-cache, not both")
        return func(*args, cache_dir="" if no_cache else cache_dir, **kwargs)

    return wrapper


def check_cache_dir(settings: Settings,
                    fix: str = "pass --cache-dir with a directory, or --no-cache to run without a cache"
                    ) -> Settings:
    """``settings`` if its cache_dir can be a directory (it, or its nearest existing parent, is
    one); else a ConfigError naming where the value came from and ``fix``."""
    chosen = settings.cache_dir
    if not chosen:
        return settings
    path = Path(chosen).expanduser()
    origin = {"env": " (from OVPOOL_CACHE_DIR)", "flag": " (from --cache-dir or --set)"}.get(
        settings.source("cache_dir"), " (the default: $XDG_CACHE_HOME/ovpool)")
    try:
        blocker = next((p for p in (path, *path.parents) if p.exists() or p.is_symlink()), None)
    except PermissionError as exc:  # a parent this user may not look into
        raise ConfigError(f"cache directory {chosen}{origin}: {exc.filename} cannot be read"
                          f" ({exc.strerror}); {fix}") from None
    if blocker is not None and not blocker.is_dir():
        what = "a file, not a directory" if blocker.is_file() else "not a directory"
        raise ConfigError(f"cache directory {chosen}{origin}: {blocker} is {what}; {fix}")
    if blocker is not None and not os.access(blocker, os.R_OK | os.X_OK):  # read-only is fine
        raise ConfigError(f"cache directory {chosen}{origin}: {blocker} cannot be read (permission"
                          f" denied); {fix}")
    return settings


def prompt_options(func: Callable) -> Callable:
    """Add the PROMPT argument (``-``: read stdin; ``@FILE``: read FILE) and ``--prompt-file``,
    ``--chat`` and ``--system``; the command gets ``prompt``: a string, or chat messages."""

    @click.argument("prompt", required=False)
    @click.option("--prompt-file", type=click.File("r", encoding="utf-8"), default=None, metavar="FILE",
                  help="Read the prompt from FILE ('-': stdin), e.g. one too long for a command line.")
    @click.option("--chat", is_flag=True, help="Send the prompt as a user message through the model's "
                  "chat template.")
    @click.option("--system", default=None, metavar="TEXT", help="A system message before the prompt "
                  "(implies --chat).")
    @functools.wraps(func)
    def wrapper(*args: Any, prompt: str | None, prompt_file: Any, chat: bool, system: str | None,
                **kwargs: Any) -> Any:
        text = read_prompt(prompt, prompt_file)
        if not (chat or system is not None):
            return func(*args, prompt=text, **kwargs)
        messages = [{"role": "system", "content": system}] if system is not None else []
        return func(*args, prompt=[*messages, {"role": "user", "content": text}], **kwargs)

    return wrapper


def read_prompt(prompt: str | None, prompt_file: Any) -> str:
    """The prompt text: PROMPT as given, ``-`` from stdin, ``@FILE`` from FILE, or --prompt-file."""
    if (prompt is None) == (prompt_file is None):
        raise click.UsageError("give the prompt once: PROMPT, - (read stdin), @FILE, or --prompt-file FILE")
    if prompt_file is not None:
        return prompt_file.read()
    if prompt == "-":
        return sys.stdin.read()
    if prompt.startswith("@") and len(prompt) > 1:
        try:
            return Path(prompt[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or exc
            raise click.BadParameter(f"cannot read the prompt file {prompt[1:]}: {why}",
                                     param_hint="PROMPT") from None
    return prompt


def sampling_options(func: Callable) -> Callable:
    """Add --max-tokens, --temperature, --top-k, --top-p, --seed, --stop and --ignore-eos; the command gets
    ``sampling``: a dict of SamplingParams fields."""

    @click.option("--max-tokens", type=click.IntRange(1), default=128, show_default=True,
                  help="Most new tokens.")
    @click.option("--temperature", type=click.FloatRange(0, 2), default=0.0, show_default=True,
                  help="Randomness of the draw; 0 is greedy (always the most probable token).")
    @click.option("--top-k", type=click.IntRange(0), default=0, show_default=True,
                  help="Draw from the K most probable tokens only; 0 turns it off.")
    @click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True,
                  help="Draw from the most probable tokens holding this share of the probability.")
    @click.option("--seed", type=int, default=None,
                  help="Seed of the draw: the same seed gives the same tokens (with --temperature > 0).")
    @click.option("--stop", multiple=True, metavar="TEXT", help="Stop before this text; repeatable.")
    @click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-sequence tokens.")
    @functools.wraps(func)
    def wrapper(*args: Any, max_tokens: int, temperature: float, top_k: int, top_p: float,
                seed: int | None, stop: tuple[str, ...], ignore_eos: bool, **kwargs: Any) -> Any:
        sampling = {"max_tokens": max_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p,
                    "seed": seed, "stop": list(stop), "ignore_eos": ignore_eos}
        return func(*args, sampling=sampling, **kwargs)

    return wrapper


def response_format_options(func: Callable) -> Callable:
    """Add --json-schema FILE, --json-object, --regex PATTERN and --grammar FILE, and pass the
    command a ``response_format`` (ovpool.response_format; None for free text)."""

    @click.option("--json-schema", type=click.File("r"), default=None, metavar="FILE",
                  help="The output is JSON valid against this JSON Schema file.")
    @click.option("--json-object", is_flag=True, help="The output is a JSON object.")
    @click.option("--regex", default=None, metavar="PATTERN", help="The output matches this regex.")
    @click.option("--grammar", type=click.File("r"), default=None, metavar="FILE",
                  help="The output follows this grammar file: Lark, or GBNF if it ends in .gbnf.")
    @functools.wraps(func)
    def wrapper(*args: Any, json_schema: Any, json_object: bool, regex: str | None, grammar: Any,
                **kwargs: Any) -> Any:
        return func(*args, response_format=_response_format(json_schema, json_object, regex, grammar),
                    **kwargs)

    return wrapper


def _response_format(json_schema: Any, json_object: bool, regex: str | None, grammar: Any) -> dict | None:
    if sum(x is not None for x in (json_schema, json_object or None, regex, grammar)) > 1:
        raise click.UsageError("give at most one of --json-schema, --json-object, --regex, --grammar")
    if json_schema is not None:
        try:
            return {"type": "json_schema", "schema": json.load(json_schema)}
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"{json_schema.name} is not JSON: {exc}",
                                     param_hint="--json-schema") from None
    if json_object:
        return {"type": "json_object"}
    if regex is not None:
        return {"type": "regex", "pattern": regex}
    if grammar is not None:
        return {"type": "grammar", "gbnf" if grammar.name.endswith(".gbnf") else "lark": grammar.read()}
    return None


def tool_options(func: Callable) -> Callable:
    """Add --tools FILE, --tool-choice and --no-parallel-tool-calls, and pass the command
    ``tools`` (a dict of those sampling parameters; {} without --tools). docs/tools.md."""

    @click.option("--tools", "tools_file", type=click.File("r"), default=None, metavar="FILE",
                  help="Functions the model may call: a JSON list of OpenAI tools "
                       '[{"type": "function", "function": {"name", "description", "parameters"}}].')
    @click.option("--tool-choice", default=None, metavar="auto|none|required|NAME",
                  help="Whether to call a tool (default auto), or NAME: call that one.")
    @click.option("--no-parallel-tool-calls", is_flag=True, help="At most one call in the reply.")
    @functools.wraps(func)
    def wrapper(*args: Any, tools_file: Any, tool_choice: str | None, no_parallel_tool_calls: bool,
                **kwargs: Any) -> Any:
        if tools_file is None:
            if tool_choice is not None or no_parallel_tool_calls:
                raise click.UsageError("--tool-choice and --no-parallel-tool-calls need --tools FILE")
            return func(*args, tools={}, **kwargs)
        try:
            tools = json.load(tools_file)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"{tools_file.name} is not JSON: {exc}", param_hint="--tools") from None
        if tool_choice is not None and tool_choice not in ("auto", "none", "required"):
            tool_choice = {"name": tool_choice}
        return func(*args, tools={"tools": tools, "tool_choice": tool_choice,
                                  "parallel_tool_calls": not no_parallel_tool_calls}, **kwargs)

    return wrapper


def resolve_settings(assignments: tuple[str, ...] = (), **flags: Any) -> Settings:
    """Settings from ``--set`` items and dedicated flags (a dedicated flag wins over --set)."""
    merged = parse_assignments(assignments)
    merged.update({k: v for k, v in flags.items() if v is not None})
    return Settings.resolve(merged)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An Event set by SIGTERM or SIGINT, so loops finish their cleanup instead of dying mid-send."""
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def timings_text(timings: dict[str, float]) -> str:
    """A completion's timings for a person, e.g. "first token 120 ms, 25.3 tokens/s, total 0.61 s"."""
    parts = []
    if "ttft_s" in timings:
        parts.append(f"first token {timings['ttft_s'] * 1000:.0f} ms")
    if "decode_tps" in timings:
        parts.append(f"{timings['decode_tps']:.1f} tokens/s")
    if "total_s" in timings:
        parts.append(f"total {timings['total_s']:.2f} s")
    return ", ".join(parts) or "no timings"


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str, ensure_ascii=False))


def run_cli(group: click.Group, obj: object = None) -> None:
    """Run ``group`` (``obj``: its context's object); an OvpoolError becomes one clear line on
    stderr and exit status 2."""
    try:
        group.main(standalone_mode=False, obj=obj)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except OvpoolError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
