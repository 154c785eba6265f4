"""What EC2 does on a start that moto does not: a stopped instance that starts again may come
back with another address. On real EC2 that is the public address (a VPC instance keeps its
primary private one); in the bed, where clusterd reaches nodes by their private addresses
(`use_internal_ips`), the private address changes, so that clusterd's following of a moved
node is tested for real. And EC2 moves the instance's LaunchTime to the start (moto keeps the
first launch's), which the cost ledger dates a start by. The controller installs this into
its in-process moto once."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("testbed.ec2.renumber")

_installed = False


def install() -> None:
    """Make moto's Instance.start give a stopped instance a fresh private address from its
    subnet and a LaunchTime of now (idempotent)."""
    global _installed
    if _installed:
        return
    from moto.core.utils import utcnow
    from moto.ec2.models.instances import Instance

    original = Instance.start

    def start(self: Any) -> Any:
        was = self._state.name
        previous = original(self)
        if was == "stopped":
            renumber(self)
            self.launch_time = utcnow()
        return previous

    Instance.start = start
    _installed = True


def renumber(inst: Any) -> str | None:
    """Move inst's primary private address to a free one of its subnet; the new address."""
    nic = inst.nics.get(0)
    if nic is None or nic.subnet is None or not nic.private_ip_address:
        return None
    subnet = nic.subnet
    old = nic.private_ip_address
    new = subnet.get_available_subnet_ip(instance=inst)  # before freeing old: never old again
    subnet.del_subnet_ip(old)
    nic.private_ip_address = new
    for entry in nic.private_ip_addresses:
        if entry.get("PrivateIpAddress") == old:
            entry["PrivateIpAddress"] = new
    inst._private_ips.discard(old)
    inst._private_ips.add(new)
    log.info("instance %s starts with a new private address: %s (was %s)", inst.id, new, old)
    return str(new)
