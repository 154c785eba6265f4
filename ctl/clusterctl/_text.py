"""Text cut for messages: the one "truncate with ..." of clusterctl and clusterd. A module of
its own, importing nothing, so that clusterctl's hot path can use it for free."""

from __future__ import annotations


def clipped(text: str, limit: int) -> str:
    """`text` if it fits in `limit` characters, else its start and "...", `limit` in all: what
    a peer or a provider sends is echoed in errors, events and logs, never whole."""
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."
