"""What ``ovpool serve`` checks before it starts any child, so a mistake a restart cannot fix is
one line and a non-zero exit, not a pool that runs on with no worker: the model file (exists, is
readable, is a GGUF) and the ports (the broker's and the HTTP API's are free now)."""

from __future__ import annotations

from ovpool.errors import ConfigError, ModelNotFoundError
from ovpool.serve import ports
from ovpool.serve.spec import PoolSpec

_GGUF_MAGIC = b"GGUF"


def check_model(model: str) -> None:
    """ModelNotFoundError or ConfigError naming ``model`` unless it is a readable GGUF file."""
    from ovpool.models import resolve_model_path

    path = resolve_model_path(model)
    try:
        with open(path, "rb") as f:
            head = f.read(len(_GGUF_MAGIC))
    except OSError as exc:
        raise ModelNotFoundError(f"cannot read model file {str(path)!r}: {exc.strerror}") from None
    if head != _GGUF_MAGIC:
        raise ConfigError(f"model file {str(path)!r} is not a GGUF file (it does not start with "
                          f"'GGUF'); pass a .gguf model or one of the aliases")


def check_ports(spec: PoolSpec) -> None:
    """ConfigError naming the address if the local broker's or the HTTP API's port is taken."""
    if spec.bind is not None:
        ports.check_broker(spec.bind)
    if spec.http:
        ports.check_http(spec.http)


def check(spec: PoolSpec) -> dict[str, str]:
    """Every check serve makes before its first child (the models only for the engine backend).
    One model: its error is raised. Several: each bad one is returned (name -> why) so the pool
    serves the others and reports that one failed."""
    bad = {}
    if spec.backend == "engine":
        if not spec.on_demand:
            check_model(spec.model)
        for model in spec.models if spec.on_demand else ():
            try:
                check_model(model.source)
            except (ConfigError, ModelNotFoundError) as exc:
                bad[model.name] = str(exc)
        if spec.on_demand and len(bad) == len(spec.models):  # a pool that could never serve
            raise ConfigError("no model can be served: " + "; ".join(f"{m}: {why}" for m, why in bad.items()))
    check_ports(spec)
    return bad
