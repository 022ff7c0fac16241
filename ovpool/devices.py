"""OpenVINO device strings: what the cache and the worker both need to know about one, without OpenVINO."""

from __future__ import annotations


def device_type(device: str) -> str:
    """The device type of an OpenVINO device string: ``GPU.1`` -> ``GPU``, ``cpu`` -> ``CPU``,
    ``HETERO:GPU,CPU`` -> ``HETERO`` (a virtual device is its own type: it may run on several)."""
    return device.split(":", 1)[0].split(".", 1)[0].upper()
