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
    after it is made: a copy with other fields is a plain dict again (`{**view, ...}`), or one made by
    `with_last`."""

    __slots__ = ("_head", "_packed")

    def __init__(self, fields: dict[str, Any]) -> None:
        super().__init__(fields)
        self._packed: bytes | None = None
        self._head: bytes | None = None  # the encoding up to the last field's value

    @property
    def packed(self) -> bytes:
        if self._packed is None:
            if self._head is not None:
                self._packed = self._head + msgpack.packb(self[next(reversed(self))],
                                                          use_bin_type=True)
            else:
                self._packed = msgpack.packb(self, use_bin_type=True)
        return self._packed

    def with_last(self, value: Any) -> Packed:
        """A copy whose last field is `value`, encoded from this one's encoding of the
        others (a refresh stamp changes one field of thousands of views)."""
        copy = Packed(self)
        copy[next(reversed(self))] = value
        copy._head = self._head_bytes()
        return copy

    def _head_bytes(self) -> bytes:
        if self._head is None:
            last = next(reversed(self))
            packer = msgpack.Packer(use_bin_type=True, autoreset=True)
            self._head = b"".join([packer.pack_map_header(len(self)),
                                   *(packer.pack(k) + packer.pack(v)
                                     for k, v in self.items() if k != last),
                                   packer.pack(last)])
        return self._head


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
