"""``ovpool settings``: every setting with its effective value and where it came from."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

import click

from ovpool.cli.common import emit_json, resolve_settings, settings_options
from ovpool.settings import REGISTRY, SCOPES, VARIABLES, Setting, Settings

if TYPE_CHECKING:
    import openvino as ov

    from ovpool.config import WorkerConfig

_SCOPE_TITLES = {"client": "Clients (ovpool.Client, the HTTP API's client)", "broker": "The broker",
                 "worker": "Workers (and Engine)", "graph": "The compiled graph (cache fingerprint)",
                 "api": "The HTTP API", "serve": "`ovpool serve` (its models)", "process": "Every process"}


@click.command("settings")
@settings_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON (for programs) instead of a table.")
@click.option("--markdown", is_flag=True, help="Print the reference page docs/configuration.md.")
def settings_command(assignments: tuple[str, ...], as_json: bool, markdown: bool) -> None:
    """Show every setting: effective value, source (flag/env/default), env var, graph-changing."""
    if markdown:
        click.echo(reference_page(), nl=False)
        return
    settings = resolve_settings(assignments)
    rows, (autos, host) = settings.rows(), resolved_autos(settings)
    for r in rows:
        if r["name"] in autos:
            r["resolved"] = autos[r["name"]]
    if as_json:
        emit_json(rows)
        return
    from ovpool.cli.tables import print_table

    print_table("ovpool settings (flag > environment > default)",
                ("name", "value", "source", "default", "env", "graph", "allowed / help"),
                [(r["name"], _text(r["value"], r.get("resolved")), r["source"], _text(r["default"]), r["env"],
                  "yes" if r["graph"] else "",
                  f"{', '.join(r['choices'])}: {r['help']}" if r["choices"] else r["help"])
                 for r in rows],
                whole=("name", "env"))
    from rich.console import Console  # its width, as the table's

    click.echo(textwrap.fill(f"auto on this host: {host}", Console().width, subsequent_indent="    ",
                             break_long_words=False, break_on_hyphens=False))


def _text(value, resolved: str | None = None) -> str:
    text = '""' if value == "" else str(value)
    return f"{text} → {resolved}" if resolved is not None else text


def resolved_autos(settings: Settings) -> tuple[dict[str, str], str]:
    """What each setting left at ``auto`` means for a worker of ``settings`` on this host (the
    worker's own choices; a model-dependent one as its rule), and a line naming the host's CPU
    class and what the CPU plugin does with a compressed MatMul's activations. A device that
    cannot be opened here (no GPU, no driver) resolves nothing, and the line says why."""
    import openvino as ov

    from ovpool.config import WorkerConfig

    config = WorkerConfig.of(settings)
    try:
        return _resolve(config, ov.Core())
    except RuntimeError as exc:  # OpenVINO's, translated here: its last line names the cause
        why = str(exc).strip().splitlines()[-1][:200]
        return {}, f"{config.device}: cannot be opened on this host, so no auto is resolved ({why})"


def _resolve(config: WorkerConfig, core: ov.Core) -> tuple[dict[str, str], str]:
    from ovpool.worker.exact_modes import exact_prefix_cache, resolve_prompt_lookup
    from ovpool.worker.graph import compile_settings, decode, loading
    from ovpool.worker.graph.cpu_class import CpuInfo

    cpu = CpuInfo.read(core)
    graph = compile_settings.resolve_auto(config.graph, config.device, core, cpu=cpu)
    autos = {name: str(graph[name]) for name, value in config.graph.values().items() if value == "auto"}
    if "attention" in autos:
        autos["attention"] = loading.choose_attention(config.graph, config.device, core, None)
        if autos["attention"] == "paged" and loading.reimport_problem(core, config.device):
            autos["attention"] += " (sdpa until it is compiled, where a start imports from the cache)"
    if config.decode_graph == "auto":
        paying = decode.pays(config.device, graph["inference_precision"], core)
        autos["decode_graph"] = decode.auto_text(config.device, paying)
    if config.prefix_cache == "auto":
        autos["prefix_cache"] = exact_prefix_cache(config.device, graph)
    if config.prompt_lookup == "auto":
        on = resolve_prompt_lookup("auto", graph) == "auto"
        autos["prompt_lookup"] = "on where its acceptance pays, one sequence at a time" if on else "off"
    properties = compile_settings.compile_config(graph, config.device, core)
    group = properties.get("DYNAMIC_QUANTIZATION_GROUP_SIZE", 32)
    int8 = "int8 in groups of 32 (16 with Q6_K weights)" if group and cpu.vnni else "off (f32 activations)"
    return autos, f"{config.device}: {cpu.describe()}; compressed MatMuls' int8 activations: {int8}"


def reference_page() -> str:
    """docs/configuration.md, from the registry (tests/test_settings_config.py keeps it current)."""
    lines = ["# Configuration", "",
             "<!-- Generated by `ovpool settings --markdown` from ovpool/settings/registry.py: edit the "
             "registry there, then regenerate. -->", "",
             "Every setting is a `--set NAME=VALUE` flag of any command, an environment variable "
             "`OVPOOL_<NAME>`, or its default: flag > environment > default. `ovpool settings` shows "
             "each one's effective value and where it came from.", "",
             "Each setting is read by the processes of its scopes; `ovpool serve --set` hands the "
             "broker, each worker and the HTTP API exactly the settings of their scopes (the HTTP API "
             "is also a client), and its children inherit its environment. Graph settings change the "
             "compiled graph: their effective values enter the compiled-model cache's fingerprint "
             "(docs/cache.md).", ""]
    for scope in SCOPES:
        settings = [s for s in REGISTRY.values() if s.scopes[0] == scope]
        if settings:
            lines += [f"## {_SCOPE_TITLES[scope]}", "", "| setting | type | default | scopes | description |",
                      "|---|---|---|---|---|", *(_row(s) for s in settings), ""]
    lines += _auto_by_class()
    lines += ["## Environment variables that are not settings", "",
              "| variable | default | read by | description |", "|---|---|---|---|"]
    lines += [f"| `{v.name}` | {_code(v.default)} | {', '.join(v.scopes)} | {_cell(v.help)} |"
              for v in VARIABLES.values()]
    return "\n".join(lines) + "\n"


def _auto_by_class() -> list[str]:
    """The page's table of what each setting left at ``auto`` resolves to on a CPU of each class,
    the other settings at their defaults: the workers' own choices (a model-dependent one as its rule)."""
    from ovpool.config import GraphConfig
    from ovpool.worker.exact_modes import exact_prefix_cache, resolve_prompt_lookup
    from ovpool.worker.graph import compile_settings, decode, loading
    from ovpool.worker.graph.cpu_class import CLASSES, choose

    defaults = GraphConfig()
    graphs = [compile_settings.resolve_cpu(defaults.values(), cpu.plugin_precision, cpu) for cpu in CLASSES]
    cells = {name: [str(g[name]) for g in graphs]
             for name, value in defaults.values().items() if value == "auto"}
    cells["attention"] = [loading.choose_attention(defaults, "CPU", None, None)] * len(CLASSES)
    cells["decode_graph"] = [f"on (models of up to {decode.MAX_WEIGHTS >> 20} MiB of weights)"
                             if choose(cpu, g["inference_precision"]).decode_graph else "off"
                             for cpu, g in zip(CLASSES, graphs, strict=True)]
    cells["prefix_cache"] = [exact_prefix_cache("CPU", g) for g in graphs]
    cells["prompt_lookup"] = ["on where it pays, alone" if resolve_prompt_lookup("auto", g) == "auto"
                              else "off" for g in graphs]
    return ["## What `auto` resolves to on each CPU class", "",
            "On the CPU, with every other setting at its default (`ovpool settings` prints what each "
            "`auto` resolved to on its host). Measured on AVX2, AVX-512 VNNI/BF16 and AMX CPUs "
            "(docs/performance.md); the other two columns are the same rule, unmeasured. On a GPU the "
            "precisions are the device's own (f16). `attention=auto` becomes sdpa where the paged graph "
            "cannot come from the cache, `decode_graph=auto` only where twice the weights fit in an "
            "eighth of the host's memory.", "",
            f"| setting | {' | '.join(cpu.model for cpu in CLASSES)} |", "|---" * (len(CLASSES) + 1) + "|",
            *(f"| `{name}` | {' | '.join(cells[name])} |" for name in REGISTRY if name in cells), ""]


def _row(s: Setting) -> str:
    kind = s.type.__name__ + (f" ≥ {s.minimum:g}" if s.minimum is not None else "")
    allowed = f" Allowed: {', '.join(f'`{c}`' for c in s.choices)}." if s.choices else ""
    default = "`$XDG_CACHE_HOME/ovpool`" if s.default_from_env else _code(s.default)
    return (f"| `{s.name}`<br>`{s.env}` | {kind} | {default} | {', '.join(s.scopes)} | "
            f"{_cell(s.help)}.{allowed} |")


def _code(value) -> str:
    text = {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
    return f"`{text}`" if text != "" else '`""`'


def _cell(text: str) -> str:
    return text.replace("|", "\\|")

def register(group: click.Group) -> None:
    group.add_command(settings_command)
