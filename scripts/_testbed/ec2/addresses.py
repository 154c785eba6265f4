"""What EC2 does that moto does not: a private address is not handed to a new instance while
the instance that had it is still shutting down. moto frees a terminated instance's address
at once and hands it out first, while the bed's node for that instance may answer on it for
a few seconds more (the watcher kills nodes in its own time). A new cluster's first SSH
contact then reaches the old node, pins its host key, and fails when the right node comes
up. The controller installs this into its in-process moto once: an address some live node
still answers on is passed over, and handed out again once that node is gone."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Any

log = logging.getLogger("testbed.ec2.addresses")

_held: Callable[[], Collection[str]] | None = None
_original: Any = None


def install(held: Callable[[], Collection[str]]) -> None:
    """Make moto's Subnet.get_available_subnet_ip pass over the addresses `held()` gives (the
    addresses of live nodes; called from moto's threads, so it must not block). Idempotent;
    a second call replaces `held`."""
    global _held, _original
    _held = held
    if _original is not None:
        return
    from moto.ec2.models.subnets import Subnet

    _original = Subnet.get_available_subnet_ip

    def get_available_subnet_ip(self: Any, instance: Any) -> str:
        busy = _held() if _held is not None else ()
        passed: list[str] = []
        try:
            while True:
                ip = str(_original(self, instance))
                if ip not in busy:
                    return ip
                # moto recorded it as the new instance's: undo that; free again below.
                self._subnet_ips.pop(ip, None)
                passed.append(ip)
        finally:
            if passed:
                self._unused_ips.update(passed)
                log.info("passed over %s: a node of an earlier instance still answers there",
                         ", ".join(passed))

    Subnet.get_available_subnet_ip = get_available_subnet_ip


def uninstall() -> None:
    """Undo install (for tests that patch an in-process moto)."""
    global _held, _original
    if _original is None:
        return
    from moto.ec2.models.subnets import Subnet

    Subnet.get_available_subnet_ip = _original
    _held, _original = None, None
