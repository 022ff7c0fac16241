"""OpenVINO device strings: what the cache and the worker both need to know about one, without
importing OpenVINO (``check_usable`` is handed the worker's Core)."""

from __future__ import annotations

from typing import Any

from ovpool.errors import ConfigError

_VIRTUAL = {"AUTO", "HETERO", "MULTI", "BATCH"}  # they name other devices: those are checked when used


def device_type(device: str) -> str:
    """The device type of an OpenVINO device string: ``GPU.1`` -> ``GPU``, ``cpu`` -> ``CPU``,
    ``HETERO:GPU,CPU`` -> ``HETERO`` (a virtual device is its own type: it may run on several)."""
    return device.split(":", 1)[0].split(".", 1)[0].upper()


def check_usable(core: Any, device: str) -> None:
    """ConfigError naming ``device`` and the devices OpenVINO sees, when it cannot open it (else the
    first compile's RuntimeError is all a user sees, a traceback deep inside the plugin)."""
    if device_type(device) in _VIRTUAL:
        return
    try:
        core.get_property(device, "FULL_DEVICE_NAME")
    except RuntimeError as exc:
        lines = [x for x in str(exc).splitlines() if x.strip()]
        why = lines[-1].strip() if lines else type(exc).__name__
        raise ConfigError(f"device {device!r} cannot be opened here ({why}); OpenVINO sees"
                          f" {', '.join(core.available_devices) or 'no device'}: pass one of them"
                          " (--device or setting device)") from None
