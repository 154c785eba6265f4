"""Frames whose big lists are made of parts encoded once, ahead of time.

`status` of 10,000 clusters is a list of 10,000 views, each a map of twenty fields, and most
of them are the same from one call to the next (a view is cached per version of its record).
Encoding the whole list again on every call was a third of the daemon's time per `status`.
A `Packed` view carries its own msgpack encoding, made once; `encode_frame` here writes a
reply whose result holds lists of them by joining those bytes, and everything else as
protocol.encode_frame does. The bytes are exactly those msgpack itself would write (a test
holds them to it), so clients see no difference.
"""

from __future__ import annotations

from typing import Any

import msgpack

from clusterctl import protocol
from clusterctl.protocol import ErrorCode, ProtocolError


class Packed(dict[str, Any]):
    """A map that knows its msgpack encoding (made on first use, then kept). Never changed
    after it is made: a copy with other fields is a plain dict again (`{**view, ...}`)."""

    __slots__ = ("_packed",)

    def __init__(self, fields: dict[str, Any]) -> None:
        super().__init__(fields)
        self._packed: bytes | None = None

    @property
    def packed(self) -> bytes:
        if self._packed is None:
            self._packed = msgpack.packb(self, use_bin_type=True)
        return self._packed


def encode_frame(message: dict[str, Any]) -> bytes:
    """protocol.encode_frame's bytes, faster for replies with lists of Packed maps."""
    result = message.get("result")
    if not isinstance(result, dict) or not any(_has_packed(v) for v in result.values()):
        return protocol.encode_frame(message)
    packer = msgpack.Packer(use_bin_type=True, autoreset=True)
    parts = [packer.pack_map_header(len(message))]
    for key, value in message.items():
        parts.append(packer.pack(key))
        if key != "result":
            parts.append(packer.pack(value))
            continue
        parts.append(packer.pack_map_header(len(result)))
        for name, field in result.items():
            parts.append(packer.pack(name))
            if _has_packed(field):
                parts.append(packer.pack_array_header(len(field)))
                parts.extend(item.packed if type(item) is Packed else packer.pack(item)
                             for item in field)
            else:
                parts.append(packer.pack(field))
    body = b"".join(parts)
    if len(body) > protocol.MAX_FRAME_BYTES:
        raise ProtocolError(
            ErrorCode.FRAME_TOO_LARGE,
            f"frame of {len(body)} bytes exceeds the limit of {protocol.MAX_FRAME_BYTES}",
        )
    return protocol.HEADER.pack(len(body)) + body


def _has_packed(value: Any) -> bool:
    return isinstance(value, list) and any(type(item) is Packed for item in value)
