"""Frames whose big lists are made of parts encoded once, ahead of time.

`status` of 10,000 clusters is a list of 10,000 views, each a map of twenty fields, and most
of them are the same from one call to the next (a view is cached per version of its record).
Encoding the whole list again on every call was a third of the daemon's time per `status`.
A `Packed` view carries its own msgpack encoding, made once; `encode_frame` here writes a
reply whose result holds lists of them by joining those bytes, and everything else as
protocol.encode_frame does. The bytes are exactly those msgpack itself would write (a test
holds them to it), so clients see no difference. A view also keeps its values' encoding, for
`status` in columns (`Columns`: the field names once, then a row per view).
"""

from __future__ import annotations

from typing import Any

import msgpack

from clusterctl import protocol
from clusterctl.protocol import ErrorCode, ProtocolError


class Packed(dict[str, Any]):
    """A map that knows its msgpack encoding (made on first use, then kept), as a map and as
    a row of its values (`Columns`). Never changed after it is made: a copy with other fields
    is a plain dict again (`{**view, ...}`), or one made by `with_last`."""

    __slots__ = ("_packed", "_row", "_split")

    def __init__(self, fields: dict[str, Any]) -> None:
        super().__init__(fields)
        self._packed: bytes | None = None
        self._row: bytes | None = None  # the values, without an array header
        # The encodings up to the last field's value: as a map (its header, the other pairs
        # and the last key) and as a row (the other values).
        self._split: tuple[bytes, bytes] | None = None

    @property
    def packed(self) -> bytes:
        if self._packed is None:
            if self._split is not None:
                self._packed = self._split[0] + _pack(self[next(reversed(self))])
            else:
                self._packed = _pack(self)
        return self._packed

    @property
    def row_values(self) -> bytes:
        """The values in field order, each encoded, with no array header before them."""
        if self._row is None:
            self._row = self._heads()[1] + _pack(self[next(reversed(self))])
        return self._row

    def with_last(self, value: Any) -> Packed:
        """A copy whose last field is `value`, encoded from this one's encoding of the
        others (a refresh stamp changes one field of thousands of views)."""
        copy = Packed(self)
        copy[next(reversed(self))] = value
        copy._split = self._heads()
        return copy

    def _heads(self) -> tuple[bytes, bytes]:
        if self._split is None:
            last = next(reversed(self))
            packer = msgpack.Packer(use_bin_type=True, autoreset=True)
            pairs = [(packer.pack(k), packer.pack(v)) for k, v in self.items() if k != last]
            self._split = (b"".join([packer.pack_map_header(len(self)),
                                     *(k + v for k, v in pairs), packer.pack(last)]),
                           b"".join(v for _, v in pairs))
        return self._split


class Columns:
    """Views sent as {columns, rows, optional} (status with `columns`): the field names once,
    then a row of values per view. The columns are the first Packed view's fields (every
    Packed view of one reply is made by the same code, with the same fields in the same
    order; with no Packed view, the fields every view has), then any other field some plain
    view has. Fields some view lacks are `optional`: null in its row, read back as absent by
    clusterctl.protocol.views_of."""

    __slots__ = ("views",)

    def __init__(self, views: list[dict[str, Any]]) -> None:
        self.views = views

    def encode(self, packer: msgpack.Packer) -> bytes:
        plain = [v for v in self.views if type(v) is not Packed]
        first = next((v for v in self.views if type(v) is Packed), None)
        if first is not None:
            columns = list(first)
        else:  # only plain views: the fields every one of them has
            columns = [k for k in (plain[0] if plain else ()) if all(k in v for v in plain)]
        known = set(columns)
        extra = []
        for view in plain:
            for key in view:
                if key not in known:
                    known.add(key)
                    extra.append(key)
        # A Packed field some plain view lacks reads back absent there too.
        lacking = [k for k in columns if any(k not in v for v in plain)]
        optional = lacking + extra
        columns += extra
        width = len(columns)
        row_header = packer.pack_array_header(width)
        nulls = packer.pack(None) * len(extra)
        parts = [packer.pack_map_header(3), packer.pack("columns"), packer.pack(columns),
                 packer.pack("optional"), packer.pack(optional),
                 packer.pack("rows"), packer.pack_array_header(len(self.views))]
        for view in self.views:
            if type(view) is Packed and len(view) + len(extra) == width:
                parts.append(row_header + view.row_values + nulls)
            else:
                parts.append(packer.pack([view.get(c) for c in columns]))
        return b"".join(parts)


def encode_frame(message: dict[str, Any]) -> bytes:
    """protocol.encode_frame's bytes, faster for replies with lists of Packed maps, and the
    only encoder of Columns."""
    result = message.get("result")
    if not isinstance(result, dict) or not any(_has_packed(v) or type(v) is Columns
                                               for v in result.values()):
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
            if type(field) is Columns:
                parts.append(field.encode(packer))
            elif _has_packed(field):
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


def _pack(value: Any) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def _has_packed(value: Any) -> bool:
    return isinstance(value, list) and any(type(item) is Packed for item in value)
