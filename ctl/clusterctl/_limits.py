"""How much one frame may hold once decoded (see DecodeLimits), and decoding within that.

Standard library and msgpack only; `protocol` re-exports what clients need.
"""

from __future__ import annotations

import msgpack

TYPE_CHECKING = False  # typing, for the type checker alone: 2 ms of every clusterctl run
if TYPE_CHECKING:
    from typing import Any

MAX_FRAME_BYTES = 8 * 1024 * 1024


class DecodeLimits:
    """What one frame may hold once decoded: an 8 MiB frame of tiny containers would
    otherwise cost hundreds of MB of Python objects. `max_items` bounds the containers and
    their elements in the whole frame; the others bound each string, byte string, array and
    map (msgpack checks those before allocating). Ext types are never part of the protocol."""

    __slots__ = ("max_array", "max_bin", "max_items", "max_map", "max_str")

    def __init__(self, *, max_items: int, max_array: int, max_map: int, max_str: int,
                 max_bin: int) -> None:
        self.max_items = max_items
        self.max_array = max_array
        self.max_map = max_map
        self.max_str = max_str
        self.max_bin = max_bin


# What the daemon accepts from clients: requests are small maps of arguments (a task's YAML
# text is the biggest string); nothing a client sends is bytes.
REQUEST_LIMITS = DecodeLimits(max_items=100_000, max_array=10_000, max_map=10_000,
                              max_str=MAX_FRAME_BYTES, max_bin=4096)
# What clients accept from the daemon: status of thousands of clusters, 10,000 events, log
# chunks as bytes.
REPLY_LIMITS = DecodeLimits(max_items=2_000_000, max_array=1_000_000, max_map=100_000,
                            max_str=MAX_FRAME_BYTES, max_bin=MAX_FRAME_BYTES)


class TooManyItems(Exception):
    pass


def unpack(body: bytes, limits: DecodeLimits) -> Any:
    """msgpack.unpackb within `limits`; raises TooManyItems past the item budget, and
    msgpack's own errors for anything else."""
    hooks: dict[str, Any] = {}
    # Each object takes at least a byte, and a container costs its length plus one, so a
    # frame spends at most two items per byte: a small one needs no counting (no Python
    # call per container, which is most of decoding a `queue` reply).
    if 2 * len(body) > limits.max_items:
        hooks["list_hook"] = hooks["object_hook"] = _counter(limits.max_items)
    return msgpack.unpackb(
        body, raw=False, strict_map_key=True, **hooks,
        max_str_len=limits.max_str, max_bin_len=limits.max_bin,
        max_array_len=limits.max_array, max_map_len=limits.max_map, max_ext_len=0,
    )


def _counter(max_items: int) -> Any:
    budget = [max_items]

    def count(container: Any) -> Any:
        budget[0] -= len(container) + 1
        if budget[0] < 0:
            raise TooManyItems
        return container

    return count
