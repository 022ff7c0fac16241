"""Options and output helpers shared by the subcommands."""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import click

from ovpool.errors import OvpoolError
from ovpool.settings import Settings, parse_assignments


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


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str, ensure_ascii=False))


def run_cli(group: click.Group) -> None:
    """Run ``group``; an OvpoolError becomes one clear line on stderr and exit status 2."""
    try:
        group.main(standalone_mode=False)
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
