"""The task's `resources.ports`, read once for every provider that opens them."""

from __future__ import annotations

from clusterd.providers.base import BlockScope, ProvisionError


def port_ranges(ports: tuple[str, ...]) -> list[tuple[int, int]]:
    """SkyPilot's port forms ("8080", "10000-10010") as (from, to) pairs."""
    ranges = []
    for text in ports:
        low, _, high = str(text).partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise ProvisionError(f"resources.ports: {text!r} is not a port or a range",
                                 BlockScope.FATAL) from None
        if not 1 <= first <= last <= 65535:
            raise ProvisionError(f"resources.ports: {text!r} is out of range",
                                 BlockScope.FATAL)
        ranges.append((first, last))
    return ranges
