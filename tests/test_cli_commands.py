"""The ``ovpool`` group loads each command's module on demand: every command stays reachable, and
a worker's start does not import the other commands' dependencies."""

import importlib
import subprocess
import sys

import click

from ovpool.cli import COMMAND_MODULES, main


def test_the_lazy_map_names_exactly_the_commands_the_modules_define():
    group = click.Group()
    for module in set(COMMAND_MODULES.values()):
        importlib.import_module(f"ovpool.cli.{module}").register(group)
    assert sorted(group.commands) == sorted(COMMAND_MODULES)
    assert main.list_commands(click.Context(main)) == sorted(COMMAND_MODULES)


def test_each_command_resolves_to_its_own_command():
    ctx = click.Context(main)
    for name in COMMAND_MODULES:
        assert main.get_command(ctx, name).name == name
    assert main.get_command(ctx, "no-such-command") is None


def test_a_worker_start_does_not_load_the_table_printer_or_cache_tools():
    code = ("import sys\nfrom ovpool.cli import main\n"
            "try:\n    main(['worker', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('rich', 'ovpool.cache.maintenance', 'ovpool.bench.run') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "Run a worker process" in out
    assert out.strip().splitlines()[-1] == "[]"
