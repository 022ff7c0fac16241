"""Messages to frames and back: ``[VERSION][command byte][msgpack map]``, every field checked
against its declared type on the way in (a hostile peer's frame is refused, never trusted).

A decode failure raises ``UnsupportedVersionError`` or ``MalformedMessageError``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack

from ovpool.errors import MalformedMessageError, UnsupportedVersionError
from ovpool.protocol.messages import Message

VERSION = b"OVP1"
_MISSING = object()

_BY_COMMAND: dict[int, type] = {cls.command: cls for cls in Message.__args__}
_COMMAND_BYTES: dict[type, bytes] = {cls: bytes([cls.command]) for cls in _BY_COMMAND.values()}
# Field name -> accepted Python types, per class (annotations are strings under __future__).
_TYPES = {"str": (str,), "int": (int,), "float": (float, int), "dict": (dict,), "list": (list,),
          "str | None": (str, type(None)), "list | None": (list, type(None)),
          "float | None": (float, int, type(None))}
_SCHEMA: dict[type, dict[str, tuple[tuple[type, ...], bool]]] = {
    cls: {f.name: (_TYPES[f.type], f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING)
          for f in dataclasses.fields(cls)}
    for cls in _BY_COMMAND.values()
}

_packb = msgpack.Packer(use_bin_type=True).pack


def encode(msg: Message) -> list[bytes]:
    # A dataclass instance's __dict__ holds exactly its fields (ClassVars live on the class).
    return [VERSION, _COMMAND_BYTES[type(msg)], _packb(msg.__dict__)]


def message_type(frames: list[bytes]) -> type:
    """The class of the message in ``frames`` without unpacking its body, for a receiver that
    only counts some messages (benchmarks/broker_driver.py); raises a ProtocolError."""
    if len(frames) != 3:
        raise MalformedMessageError(f"expected 3 frames (version, command, body), got {len(frames)}")
    version, command, _ = frames
    if version != VERSION:
        raise UnsupportedVersionError(f"protocol version {bytes(version)[:16]!r} is not {VERSION!r}")
    cls = _BY_COMMAND.get(command[0]) if len(command) == 1 else None
    if cls is None:
        raise MalformedMessageError(f"unknown command {bytes(command)[:8]!r}")
    return cls


def decode(frames: list[bytes]) -> Message:
    """The message in ``frames`` (identity frames already removed); raises a ProtocolError."""
    cls = message_type(frames)
    try:
        data = msgpack.unpackb(frames[2], raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types for corrupt input
        raise MalformedMessageError(f"{cls.__name__}: body is not valid msgpack") from exc
    return cls(**_checked(cls, data))


def request_id_of(frames: list[bytes]) -> str:
    """The request a message of a known command names though ``decode`` refused it ("" if none),
    so that its receiver can fail that request alone instead of leaving it waiting."""
    try:
        message_type(frames)
        data = msgpack.unpackb(frames[2], raw=False, strict_map_key=False)
    except Exception:  # a ProtocolError, or msgpack's several types for corrupt input
        return ""
    rid = data.get("request_id") if type(data) is dict else None
    return rid if type(rid) is str else ""


def _checked(cls: type, data: Any) -> dict[str, Any]:
    if type(data) is not dict:
        raise MalformedMessageError(f"{cls.__name__}: body must be a map")
    out = {}
    for name, (types, required) in _SCHEMA[cls].items():
        value = data.get(name, _MISSING)
        if value is _MISSING:
            if required:
                raise MalformedMessageError(f"{cls.__name__}: missing field {name!r}")
        elif type(value) in types:  # exact types: a bool is not an int here
            out[name] = value
        else:
            raise MalformedMessageError(f"{cls.__name__}.{name}: unexpected type {type(value).__name__}")
    return out
