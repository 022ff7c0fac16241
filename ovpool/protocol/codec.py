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
_REQUIRED = object()
_new = object.__new__

_BY_COMMAND: dict[int, type] = {cls.command: cls for cls in Message.__args__}
_COMMAND_BYTES: dict[type, bytes] = {cls: bytes([cls.command]) for cls in _BY_COMMAND.values()}
# Field name -> accepted Python types, per class (annotations are strings under __future__).
_TYPES = {"str": (str,), "int": (int,), "float": (float, int), "dict": (dict,), "list": (list,),
          "str | None": (str, type(None)), "list | None": (list, type(None)),
          "float | None": (float, int, type(None))}


def _default(f: dataclasses.Field) -> Any:
    """What a missing field gets: a factory for a mutable default, _REQUIRED for none."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory
    return _REQUIRED if f.default is dataclasses.MISSING else (lambda value=f.default: value)


# Field name -> (accepted types, its default), in declaration order. decode fills a message's
# __dict__ without calling __init__ (a frozen dataclass's sets each field through
# object.__setattr__: a third of a SUBMIT's decode), so no message class may have __post_init__
# (tests/test_protocol.py holds them to it).
_SCHEMA: dict[type, dict[str, tuple[tuple[type, ...], Any]]] = {
    cls: {f.name: (_TYPES[f.type], _default(f)) for f in dataclasses.fields(cls)}
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
        # msgpack>=1.0's defaults (pyproject) are raw=False, strict_map_key=True, use_list=True;
        # passing them again costs keyword parsing on every message.
        data = msgpack.unpackb(frames[2])
    except Exception as exc:  # msgpack raises several unrelated types for corrupt input
        raise MalformedMessageError(f"{cls.__name__}: body is not valid msgpack") from exc
    return _checked(cls, data)


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


def _checked(cls: type, data: Any) -> Message:
    """``cls`` from the map ``data``: its fields, each of its declared type, the rest ignored."""
    if type(data) is not dict:
        raise MalformedMessageError(f"{cls.__name__}: body must be a map")
    msg = _new(cls)
    fields = msg.__dict__
    for name, (types, default) in _SCHEMA[cls].items():
        value = data.get(name, _MISSING)
        if value is _MISSING:
            if default is _REQUIRED:
                raise MalformedMessageError(f"{cls.__name__}: missing field {name!r}")
            value = default()
        elif type(value) not in types:  # exact types: a bool is not an int here
            raise MalformedMessageError(f"{cls.__name__}.{name}: unexpected type {type(value).__name__}")
        fields[name] = value
    return msg
