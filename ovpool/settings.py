"""One registry of every ovpool setting.

Each setting has a name, a type, its allowed values, a default, an environment variable
(``OVPOOL_<NAME>``) and a command-line form (``--set NAME=VALUE``). Settings marked ``graph``
change the compiled graph, so their effective values enter the cache fingerprint.

Resolution order: flag > environment > default; every resolved value remembers its source. A
default may depend on the environment: ``cache_dir`` is ``$XDG_CACHE_HOME/ovpool`` (else
``~/.cache/ovpool``) for every command and for ``Engine``; an empty ``cache_dir`` turns caching off.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ovpool.errors import InvalidSettingError, UnknownSettingError

# Which processes read a setting: a client (ovpool.Client, the HTTP API's too), the broker, a worker,
# a worker's compiled graph (these enter the cache fingerprint), the HTTP API, any ovpool process.
CLIENT, BROKER, WORKER, GRAPH, API, PROCESS = "client", "broker", "worker", "graph", "api", "process"
SERVE = "serve"  # `ovpool serve` itself: which of its models are loaded
SCOPES = (CLIENT, BROKER, WORKER, GRAPH, API, SERVE, PROCESS)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/ovpool``, else ``~/.cache/ovpool`` (the XDG base directory convention)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "ovpool"


@dataclass(frozen=True)
class Setting:
    name: str
    type: type
    default: Any
    help: str
    scopes: tuple[str, ...]  # the processes that read it (SCOPES)
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    default_from_env: Callable[[Mapping[str, str]], Any] | None = None  # a default that depends on env

    def __post_init__(self) -> None:
        unknown = set(self.scopes) - set(SCOPES)
        if not self.scopes or unknown:
            raise ValueError(f"setting {self.name}: scopes {self.scopes} (known: {', '.join(SCOPES)})")

    @property
    def graph(self) -> bool:
        """It changes the compiled graph: its effective value enters the cache fingerprint."""
        return "graph" in self.scopes

    def default_in(self, env: Mapping[str, str]) -> Any:
        return self.default if self.default_from_env is None else self.default_from_env(env)

    @property
    def env(self) -> str:
        return "OVPOOL_" + self.name.upper()

    def parse(self, raw: Any, from_env: bool = False) -> Any:
        """``raw`` (a string from a flag or the environment, or a Python value) as this type; an
        error names the setting, or the environment variable that set it (``from_env``)."""
        try:
            value = self._convert(raw)
        except ValueError as exc:
            raise self._invalid(raw, f"is not {self._expected()}", from_env) from exc
        if self.choices is not None and value not in self.choices:
            raise self._invalid(raw, f"is not allowed{self._allowed()}", from_env)
        if self.minimum is not None and value < self.minimum:
            raise self._invalid(raw, f"is below the minimum {self.minimum:g}", from_env)
        return value

    def _invalid(self, raw: Any, problem: str, from_env: bool) -> InvalidSettingError:
        if from_env:
            return InvalidSettingError(f"environment variable {self.env}={raw!r} (setting {self.name}) "
                                       f"{problem}; fix or unset {self.env}")
        return InvalidSettingError(f"setting {self.name}: {raw!r} {problem}")

    def _expected(self) -> str:
        kind = {int: "a whole number", float: "a number"}.get(self.type)
        if kind is None:
            return f"a valid {self.type.__name__}{self._allowed()}"
        at_least = f" >= {self.minimum:g}" if self.minimum is not None else ""
        return f"a valid {self.type.__name__} ({kind}{at_least})"

    def _convert(self, raw: Any) -> Any:
        if self.type is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError(raw)
        if isinstance(raw, str):
            raw = raw.strip()
        return self.type(raw)

    def _allowed(self) -> str:
        if self.choices is not None:
            return f"; allowed values: {', '.join(self.choices)}"
        if self.type is bool:
            return "; use on/off, true/false or 1/0"
        return ""


_SETTINGS = [
    # Where and how to run.
    Setting("device", str, "CPU", "OpenVINO device: CPU, GPU, GPU.1, ...", scopes=(WORKER,)),
    Setting("broker", str, "tcp://127.0.0.1:5555", "broker endpoint for clients and workers",
            scopes=(CLIENT, WORKER, API)),
    Setting("connect_timeout_s", float, 2.0, "client: how long a request waits for a connection to "
            "the broker (none yet, or a dropped one: a broker restarted within it gets the request "
            "again) before it fails with BrokerUnavailableError", minimum=0.01, scopes=(CLIENT,)),
    Setting("cache_dir", str, "", "compiled-model cache directory (default $XDG_CACHE_HOME/ovpool, else "
            "~/.cache/ovpool; empty: no cache, as --no-cache)",
            default_from_env=lambda env: str(default_cache_dir(env)), scopes=(WORKER,)),
    Setting("cache_only", bool, False, "import from the cache or fail; never compile or read weights",
            scopes=(WORKER,)),
    Setting("source_identity", str, "metadata", "how a GGUF is identified in the cache fingerprint",
            choices=("metadata", "content"), scopes=(WORKER,)),
    Setting("slots", int, 8, "concurrent sequences one worker serves", minimum=1, scopes=(WORKER,)),
    Setting("metrics_port", int, 0, "broker: Prometheus /metrics HTTP port (0: off)", minimum=0,
            scopes=(BROKER,)),
    Setting("queue_limit", int, 256, "requests the broker queues per model before QueueFull", minimum=0,
            scopes=(BROKER,)),
    Setting("stream_stall_s", float, 30.0, "broker: a stream whose reader takes none of the tokens "
            "waiting for it for this long fails with ClientTooSlowError", minimum=0.01, scopes=(BROKER,)),
    Setting("progress_timeout_s", float, 60.0, "broker: a worker that sends no token of a request "
            "for this long (prefill included) loses it to another worker, and gets no new request "
            "until one of its others finishes", minimum=0.01, scopes=(BROKER,)),
    Setting("keep_alive_s", float, 300.0, "serve with several models: seconds a loaded model may sit "
            "idle before it unloads (Ollama's keep_alive; -1: never; 0: right after each request); a "
            "models file's keep_alive sets it per model", minimum=-1, scopes=(SERVE,)),
    Setting("max_loaded", int, 0, "serve with several models: at most this many loaded at once (each on "
            "every device it runs on); to load another, the least recently used idle one that is not "
            "pinned unloads first (0: no limit)", minimum=0, scopes=(SERVE,)),
    Setting("max_loaded_mb", float, 0.0, "serve with several models: at most this many MiB of loaded "
            "models per device, measured as their workers' PSS; over it, the least recently used idle "
            "one that is not pinned unloads (0: no limit)", minimum=0, scopes=(SERVE,)),
    Setting("spare_worker", bool, True, "serve with several models: keep one worker process started "
            "ahead, its libraries imported, so that a load skips the interpreter's start and the "
            "imports (a second or more); it holds ~40 MiB PSS while it waits", scopes=(SERVE,)),
    Setting("routing", str, "prefix", "broker: which free worker gets a request: prefix (the one "
            "most likely to hold its prompt's prefix in its cache, within a small load margin of the "
            "least busy) or least_loaded", choices=("prefix", "least_loaded"), scopes=(BROKER,)),
    Setting("cache_lock_timeout_s", float, 600.0, "how long a start waits for another process's "
            "cache lock (it logs the holder meanwhile) before compiling without exporting; "
            "cache-only mode fails then", minimum=0.0, scopes=(WORKER,)),
    Setting("max_prompt_tokens", int, 8192, "longest prompt a worker accepts", minimum=1, scopes=(WORKER,)),
    Setting("max_new_tokens", int, 4096, "largest max_tokens a request may ask for", minimum=1,
            scopes=(BROKER, WORKER, API)),
    Setting("shutdown_timeout_s", float, 30.0, "drain (SIGTERM to serve or the HTTP API, `ovpool "
            "drain`, a rolling restart): how long requests already accepted may run on before what "
            "is left fails with request.draining (vLLM's --shutdown-timeout); new requests are "
            "refused at once, retryable (HTTP 503 + Retry-After)", minimum=0.0, scopes=(API,)),
    Setting("curve_secret_key", str, "", "this peer's CURVE key pair file (.key_secret; empty: no CURVE)",
            scopes=(CLIENT, BROKER, WORKER)),
    Setting("curve_server_key", str, "", "the broker's CURVE public key file (clients and workers)",
            scopes=(CLIENT, WORKER)),
    Setting("curve_allowed_keys", str, "", "broker: directory of the public keys of its clients "
            "(they may submit; the HTTP API is a client)", scopes=(BROKER,)),
    Setting("curve_worker_keys", str, "", "broker: directory of the public keys of its workers (they "
            "may register and serve; CURVE needs both directories, one key's role is its directory)",
            scopes=(BROKER,)),
    Setting("prefill_chunk", int, 256, "prompt tokens prefilled per step while others decode", minimum=1,
            scopes=(WORKER,)),
    Setting("warm_up", str, "idle", "when the device's one-time kernel set-up runs (a short prefill "
            "and a decode step): idle (a worker, once it is registered and nothing waits; a bare "
            "Engine leaves it to its first requests), load (in Engine(...)) or off",
            choices=("idle", "load", "off"), scopes=(WORKER,)),
    Setting("batching", str, "paged", "how a worker runs its sequences: paged (one batched forward pass "
            "per step, continuous batching) or interleaved (no second, batching graph: requests run as "
            "the engine's own generations, batched on its graph where that is the paged one)",
            choices=("paged", "interleaved"), scopes=(WORKER,)),
    Setting("decode_graph", str, "auto", "a second compiled graph fixed to one token of one sequence "
            "for decode steps of the paged graph, made by a warm-up or after 128 decode steps (a faster "
            "CPU decode step, docs/performance.md; a second layout of the weights): on, off, or auto (on the "
            "CPU for models of up to 512 MiB of weights, where that second layout costs less memory than "
            "its faster step is worth, and only if twice the weights fit in an eighth of physical memory; "
            "not on AMX at f32, where its step was ~8% faster, not enough for that memory)",
            choices=("auto", "on", "off"), scopes=(WORKER,)),
    Setting("decode_threads", int, 0, "threads the CPU decode graph runs on (0: every core, the "
            "plugin's default; fewer can decode as fast on cores shared with other jobs)", minimum=0,
            scopes=(WORKER,)),
    Setting("kv_cache_mb", int, 256, "MiB of paged KV-cache blocks per worker (batching=paged)", minimum=1,
            scopes=(WORKER,)),
    Setting("prefix_cache", str, "auto", "reuse the KV of a prompt's beginning that an earlier sequence "
            "computed (a shared system prompt, a chat's history), inside kv_cache_mb: on (only KV "
            "computed as the new request would compute it: answers unchanged), all (also a resent "
            "answer's, computed one token at a time: faster next turns, answers may differ), off; "
            "auto: on where measured exact (CPU at f32; bf16 on AVX-512 VNNI/BF16; not a u8 KV "
            "cache), else off (docs/prefix-caching.md)",
            choices=("auto", "on", "all", "off"), scopes=(WORKER,)),
    Setting("answer_copies", bool, True, "with prefix_cache on: a batched pass that only decodes also "
            "computes one full block of a running answer as a prompt pass would, cached for the chat's "
            "next turn, which then reuses its last answer too, with the same tokens; the same work, "
            "moved out of the next turn's time to first token (docs/prefix-caching.md)", scopes=(WORKER,)),
    Setting("prompt_lookup", str, "auto", "prompt-lookup speculative decoding: a decode step also "
            "verifies the tokens that followed the latest earlier occurrence of the text's last tokens "
            "(in its prompt or its answer so far), in the same pass; the tokens are those without it: "
            "on, off, or auto (at f32 only, per sequence as many as its measured acceptance pays for, "
            "while it decodes alone; docs/prompt-lookup.md)", choices=("auto", "on", "off"),
            scopes=(WORKER,)),
    Setting("prompt_lookup_tokens", int, 4, "prompt lookup: the most proposed tokens one decode step "
            "verifies", minimum=1, scopes=(WORKER,)),
    Setting("kv_tier", bool, True, "keep full prompt KV blocks on disk under the cache directory "
            "(<cache_dir>/v1/kv), shared by the host's workers of one graph and kept across restarts: "
            "a prompt whose beginning any of them computed loads it instead of computing it; only "
            "with a cache directory and where prefix_cache is on (docs/prefix-caching.md)",
            scopes=(WORKER,)),
    Setting("kv_events_endpoint", str, "", "publish the prefix cache's block events (stored, removed, "
            "all cleared) on a ZeroMQ PUB socket here, in vLLM's KV-events format, topic "
            "kv@<host>@<model>, for a gateway's prefix-aware endpoint picker: tcp://*:5557 binds, "
            "tcp://host:port connects; empty: off (docs/operations.md, Beyond one host)",
            scopes=(WORKER,)),
    Setting("kv_tier_mb", int, 1024, "MiB of disk the KV tier may take (every model's blocks "
            "together; least recently used blocks go first)", minimum=1, scopes=(WORKER,)),
    Setting("kv_ram_mb", int, 128, "MiB of host RAM each worker keeps KV blocks in above the disk "
            "tier (with kv_tier): the blocks its prompts computed or loaded, least recently used "
            "out, so a prefix evicted from kv_cache_mb comes back without a disk read; 0: none "
            "(docs/prefix-caching.md)", minimum=0, scopes=(WORKER,)),
    Setting("cache_max_mb", int, 20480, "MiB the whole cache directory may take (compiled models "
            "and the KV tier): past it, the least recently used entries and blocks go as new ones "
            "are written, never one a live worker maps (docs/cache.md)", minimum=1, scopes=(WORKER,)),
    # Graph-changing: these enter the cache fingerprint.
    Setting("inference_precision", str, "auto", "compute precision (auto: f32 on the CPU, the exact "
            "graph's numbers whatever the batch, where the plugin would pick bf16; the device's own "
            "elsewhere, f16 on GPUs; docs/performance.md, Quality)",
            choices=("auto", "f32", "bf16", "f16"), scopes=(GRAPH,)),
    Setting("kv_cache_precision", str, "auto", "KV-cache element type (auto on the CPU: f32 at f32 "
            "compute, the same tokens batched or alone; f16 at bf16, faster to decode than the "
            "plugin's u8 for twice the memory; the device's default elsewhere)",
            choices=("auto", "f32", "f16", "bf16", "u8"), scopes=(GRAPH,)),
    Setting("attention", str, "auto", "single-stream attention: paged (PagedAttention, the batching "
            "graph), sdpa (stateful ScaledDotProductAttention) or manual (stateful MatMul/Softmax); "
            "auto: paged, or sdpa where the paged graph cannot come from the cache",
            choices=("auto", "paged", "sdpa", "manual"), scopes=(GRAPH,)),
    Setting("stateful", bool, True, "keep the KV cache in OpenVINO state variables", scopes=(GRAPH,)),
    Setting("kquant_requant", str, "auto", "requantize K-quant weights (lossy) to 32-weight groups: "
            "q8_sym32 or q4_asym32 (Q4_K and Q6_K), q6_k_q8_sym32 (Q6_K alone, so its 16-weight groups "
            "no longer set every MatMul's int8 activation group to 16), or none; auto: q6_k_q8_sym32 "
            "where the CPU quantizes activations to int8 (VNNI/AMX at bf16), none elsewhere",
            choices=("auto", "none", "q4_asym32", "q8_sym32", "q6_k_q8_sym32"), scopes=(GRAPH,)),
    Setting("q4_storage", str, "auto", "how 4-bit codes (Q4_0, Q4_1, Q4_K) sit in the graph: i4 (packed) "
            "or i8 (one per byte, same values; the CPU plugin's first-inference set-up is faster, "
            "weights take twice the memory and decode reads twice the bytes); auto: i4",
            choices=("auto", "i4", "i8"), scopes=(GRAPH,)),
    Setting("zero_points", str, "auto", "how Q4_1/Q4_K's per-block minimum enters the graph: float (an "
            "exact float zero point) or integer (a rounded u4 zero point plus the exact remainder as a "
            "small correction term, so the CPU plugin's int8 kernels take the MatMul), or rounded "
            "(the rounded zero point alone, as OpenVINO GenAI reads Q4_1: faster, not exact: it agrees "
            "less often with the f32 reference's top token, docs/performance.md); auto: "
            "integer where the CPU quantizes activations to int8 (VNNI/AMX at bf16), float elsewhere",
            choices=("auto", "float", "integer", "rounded"), scopes=(GRAPH,)),
]

REGISTRY: dict[str, Setting] = {s.name: s for s in _SETTINGS}


@dataclass(frozen=True)
class Variable:
    """An environment variable that is not a setting (no ``--set``): what reads it, and why."""

    name: str
    scopes: tuple[str, ...]
    default: str
    help: str


_VARIABLES = [
    Variable("OVPOOL_LOG_LEVEL", (PROCESS,), "INFO",
             "log level (as --log-level): DEBUG, INFO, WARNING, ERROR"),
    Variable("OVPOOL_LOG_JSON", (PROCESS,), "off", "log JSON lines instead of text (as --log-json): on/off"),
    Variable("OVPOOL_HEARTBEAT_INTERVAL_S", (PROCESS,), "1.0", "seconds between heartbeats; every timeout "
             "of the pool (liveness, reconnects, supervision) is a multiple of it (tests shorten it)"),
    Variable("OVPOOL_MODEL", (PROCESS,), "smollm2", "the model of `ovpool serve` (as --model)"),
    Variable("OVPOOL_KEEP_UP_ON_WORKER_FAILURE", (PROCESS,), "off",
             "`ovpool serve --keep-up-on-worker-failure`: on/off"),
    Variable("OVPOOL_API_KEY", (API,), "", "Bearer keys the HTTP API requires, comma-separated "
             "(`ovpool api`, `ovpool serve`; serve's workers and broker never see it)"),
    Variable("OVPOOL_HTTP_BIND", (API,), "127.0.0.1:8000", "where `ovpool api` listens (as --bind)"),
    Variable("OVPOOL_CACHE_TEST_PAUSE", (WORKER,), "", "test hook: a cache writer stops at this phase "
             "(blob-write, blob-renamed, manifest-write) until a signal (ovpool/cache/store.py)"),
    Variable("ONEDNN_MAX_CPU_ISA", (PROCESS,), "", "benchmarks: the instruction set oneDNN may use, set by "
             "--isa for the benchmark and its children (ovpool/bench/isa.py)"),
    Variable("XDG_CACHE_HOME", (PROCESS,), "~/.cache",
             "base of the default cache_dir and of joined model files"),
    Variable("XDG_RUNTIME_DIR", (PROCESS,), "", "where `ovpool serve` keeps its pool's CURVE keys (when this "
             "user's; else the temporary directory)"),
]

VARIABLES: dict[str, Variable] = {v.name: v for v in _VARIABLES}


def variable(name: str, env: Mapping[str, str] | None = None) -> str:
    """The value of the registered environment variable ``name`` ("" when unset)."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not registered in ovpool.settings.VARIABLES")
    return (os.environ if env is None else env).get(name, "")


def set_variable(name: str, value: str | None) -> str | None:
    """Set (None: unset) a registered variable or a setting's OVPOOL_<NAME> for this process and
    the children it starts (benchmarks, tests); the previous value."""
    if name not in VARIABLES and name not in {s.env for s in REGISTRY.values()}:
        raise KeyError(f"{name} is neither a setting's variable nor in ovpool.settings.VARIABLES")
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    return old


def child_environment(extra: Mapping[str, str] | None = None, drop: Iterable[str] = ()) -> dict[str, str]:
    """This process's environment for a child process, with ``extra`` set and ``drop`` removed."""
    base = {k: v for k, v in os.environ.items() if k not in set(drop)}
    return {**base, **(extra or {})}


def heartbeat_interval_s(env: Mapping[str, str] | None = None) -> float:
    """OVPOOL_HEARTBEAT_INTERVAL_S as a positive number; a bad value names the variable."""
    raw = variable("OVPOOL_HEARTBEAT_INTERVAL_S", env) or VARIABLES["OVPOOL_HEARTBEAT_INTERVAL_S"].default
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise InvalidSettingError(f"environment variable OVPOOL_HEARTBEAT_INTERVAL_S={raw!r} is not a "
                                  "positive number of seconds; fix or unset it")
    return value


def lookup(name: str) -> Setting:
    key = name.strip().lower().replace("-", "_")
    if key not in REGISTRY:
        raise UnknownSettingError(f"unknown setting {name!r}; valid names: {', '.join(REGISTRY)}")
    return REGISTRY[key]


def parse_assignments(items: Iterable[str]) -> dict[str, str]:
    """``["NAME=VALUE", ...]`` from ``--set`` flags as a dict; a malformed item is an error."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise InvalidSettingError(f"--set {item!r}: expected NAME=VALUE, e.g. --set stateful=off")
        out[lookup(name).name] = value
    return out


class Settings:
    """Resolved values of every setting, each with its source (``flag``, ``env`` or ``default``)."""

    def __init__(self, values: Mapping[str, Any], sources: Mapping[str, str],
                 defaults: Mapping[str, Any] | None = None):
        self._values = dict(values)
        self._sources = dict(sources)
        self._defaults = dict(defaults or {})  # defaults that depend on the environment, as resolved

    @classmethod
    def resolve(cls, flags: Mapping[str, Any] | None = None,
                env: Mapping[str, str] | None = None) -> Settings:
        flags = {lookup(k).name: v for k, v in (flags or {}).items() if v is not None}
        env = os.environ if env is None else env
        values, sources = {}, {}
        defaults = {s.name: s.default_in(env) for s in REGISTRY.values() if s.default_from_env}
        for s in REGISTRY.values():
            if s.name in flags:
                values[s.name], sources[s.name] = s.parse(flags[s.name]), "flag"
            elif s.env in env:
                values[s.name], sources[s.name] = s.parse(env[s.env], from_env=True), "env"
            else:
                values[s.name], sources[s.name] = defaults.get(s.name, s.default), "default"
        return cls(values, sources, defaults)

    @classmethod
    def coerce(cls, settings: Settings | Mapping[str, Any] | None) -> Settings:
        """What an API that takes ``settings=`` accepts: a Settings, a dict of flags, or None."""
        return settings if isinstance(settings, Settings) else cls.resolve(settings)

    def __getitem__(self, name: str) -> Any:
        return self._values[lookup(name).name]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except UnknownSettingError as exc:
            raise AttributeError(name) from exc

    def source(self, name: str) -> str:
        return self._sources[lookup(name).name]

    def replace(self, **flags: Any) -> Settings:
        """A copy with ``flags`` applied as flag-sourced values."""
        values, sources = dict(self._values), dict(self._sources)
        for name, raw in flags.items():
            s = lookup(name)
            values[s.name], sources[s.name] = s.parse(raw), "flag"
        return Settings(values, sources, self._defaults)

    def graph_values(self) -> dict[str, Any]:
        """Effective graph-changing values: an explicit default equals unset here."""
        return {s.name: self._values[s.name] for s in REGISTRY.values() if s.graph}

    def rows(self) -> list[dict[str, Any]]:
        return [
            {"name": s.name, "value": self._values[s.name], "source": self._sources[s.name],
             "default": self._defaults.get(s.name, s.default), "type": s.type.__name__,
             "choices": list(s.choices or []),
             "env": s.env, "graph": s.graph, "scopes": list(s.scopes), "help": s.help}
            for s in REGISTRY.values()
        ]
